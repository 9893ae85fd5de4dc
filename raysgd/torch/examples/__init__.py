"""Legacy ``ray.util.sgd.torch.examples`` helpers."""
