"""Pure sources: each turns one kind of input (node reports, fabric dumps, models) into graph facts."""
