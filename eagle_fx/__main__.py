"""`python -m eagle_fx`: run the builder tour on the NumPy backend and print what it shows."""
import runpy

runpy.run_module("eagle_fx.tour", run_name="__main__")
