"""Tier inference: the fabric graph -> the nested performance domains (`infer`), over node classes,
switch levels, candidate domains, their nesting, and the parts kept between inferences."""
