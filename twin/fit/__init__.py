"""`twin fit`: a machine's remaining costs, learned from measured small runs (see twin.fit.solve)."""
