"""Legacy ``ray.util.sgd.data.examples``."""
