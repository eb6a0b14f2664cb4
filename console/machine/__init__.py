"""`cetlab machine add/remove` and `cetlab lab upgrade`: a machine set up, changed and rolled out over the operator's ssh."""
