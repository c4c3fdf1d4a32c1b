"""The plan layer: an expression's axes and accesses, rTiles, the RProgram, construction and the cost model. Plain data and arithmetic: it imports no compiler back end and touches no device."""
