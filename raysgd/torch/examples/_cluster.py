"""What the example modules share: the legacy cluster flags, joining Ray from them, running
set-up work where the workers run (also under Ray Client), and clear errors for optional
dependencies."""
from __future__ import annotations

import argparse
import importlib
from typing import Any, Callable, Optional

from raysgd.driver.placement import driver_is_ray_client as client_connected


def on_cluster(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, run as a Ray task when the driver is a Ray Client.

    A Ray Client driver is not a cluster node: its files, home directory and
    installed packages are not the workers'. Set-up whose answer depends on the
    machine (is the data set on disk? train a helper model with scikit-learn)
    therefore runs on the cluster there, and in this process otherwise.
    """
    if not client_connected():
        return fn(*args, **kwargs)
    import ray

    return ray.get(ray.remote(fn).remote(*args, **kwargs))


def require(module: str, install: str, purpose: str):
    """Import ``module``; if it is missing, say what to install."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(f"{purpose} needs the {module.split('.')[0]!r} package, which is not "
                          f"installed: pip install {install}") from error


def add_cluster_flags(parser: argparse.ArgumentParser, num_workers: int) -> None:
    """The flags every legacy example took: workers, GPU, and where Ray runs."""
    parser.add_argument("--num-workers", "-n", type=int, default=num_workers)
    parser.add_argument("--use-gpu", action="store_true")
    parser.add_argument("--address", default=None,
                        help="Ray address: 'auto' joins a running cluster (default: start one)")
    parser.add_argument("--server-address", default=None,
                        help="host:port of a Ray Client server; the driver connects to "
                             "ray://host:port")


def init_ray(args: argparse.Namespace, num_cpus: Optional[int] = None) -> None:
    """``ray.init`` from :func:`add_cluster_flags`' flags; a local Ray gets ``num_cpus``."""
    import ray

    if args.server_address:
        ray.init(f"ray://{args.server_address}")
    elif args.address:
        ray.init(address=args.address)
    else:
        ray.init(num_cpus=num_cpus)
