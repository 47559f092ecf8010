"""`angpt scaling`: the ladder and the batch-size study run through the driver (run.py), in a folder that holds one or
both (folder.py), with one report over them (report.py, render.py, plots.py) and one command line (cli.py)."""
