"""Where each worker's LightningModule comes from: ``from_ptl``'s first argument.

* **A class with arguments**, ``from_ptl(LitModel, module_args=(...), module_kwargs={...})``:
  every worker calls ``LitModel(*module_args, **module_kwargs)`` on its own copy of
  the arguments (they travel pickled, so an ``nn.Module`` or ``functools.partial``
  argument is fine).
* **A class alone** keeps Ray 1.12's rule, ``LitModel(config=config)`` when the
  constructor has a ``config`` parameter and ``LitModel()`` when it has no required
  one, and extends it: ``LitModel(config)`` when it has one required positional parameter.
* **An instance built on the driver**, ``from_ptl(LitModel(net, lr=1e-3))``: shipped
  to every worker pickled, as Lightning's spawn strategies ship it; each worker trains
  its own copy (the driver's object is never trained: ``trainer.get_model()`` returns
  the trained module).
* **A factory**, any other callable: ``factory(config)`` on every worker, returning a
  LightningModule (for constructor arguments that depend on the trainer's config, e.g.
  under Tune). Like a legacy ``model_creator`` it should build its objects itself: what it
  closes over is copied to remote workers, but shared with the driver by a
  ``use_local=True`` rank 0, which runs in the driver's process.

Every argument list is checked against the constructor's signature on the driver,
before any actor starts; a constructor that still fails under the legacy rule's
guess (the config passed to a parameter not named ``config``) is reported on the
worker with what raysgd passed.
"""
from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Tuple

import torch
from torch import nn

from raysgd.errors import ConfigError
from raysgd.lightning.compat import check_version, find_base
from raysgd.lightning.errors import NotALightningModuleError

POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
# A constructor parameter annotated with one of these can never take the config dict.
NOT_A_CONFIG = (int, float, bool, str, bytes, nn.Module, torch.Tensor)
STYLES = ("pass its arguments: from_ptl({name}, module_args=(...), module_kwargs={{...}}); or "
          "build it on the driver: from_ptl({name}(...)); or pass a factory: "
          "from_ptl(lambda config: {name}(...))")


@dataclass(frozen=True)
class ModuleSource:
    """How a worker gets its module: ``kind`` is "class", "instance" or "factory"."""

    kind: str
    target: Any
    args: Tuple[Any, ...] = ()
    kwargs: Dict[str, Any] = field(default_factory=dict)

    @property
    def module_cls(self) -> Optional[type]:
        """The LightningModule class when known on the driver (None for a factory)."""
        if self.kind == "class":
            return self.target
        return type(self.target) if self.kind == "instance" else None

    @property
    def name(self) -> str:
        cls = self.module_cls
        return cls.__name__ if cls is not None else getattr(self.target, "__name__", "factory")

    @property
    def legacy(self) -> bool:
        """A class without arguments: built by Ray 1.12's ``Module(config)`` / ``Module()`` rule."""
        return self.kind == "class" and not self.args and not self.kwargs

    def build(self, config: dict) -> Any:
        """This worker's module (its own copy of every argument, or of the instance)."""
        if self.kind == "instance":
            return copy.deepcopy(self.target)
        if self.kind == "factory":
            module = self.target(config)
            if find_base(type(module), "LightningModule") is None:
                raise ConfigError(f"from_ptl's factory {_callable_name(self.target)} returned "
                                  f"{type(module).__name__}, not a LightningModule; return the "
                                  "module, e.g. lambda config: LitModel(net, lr=config['lr']).")
            check_version(find_base(type(module), "LightningModule"))
            return module
        if not self.legacy:
            args, kwargs = copy.deepcopy((self.args, self.kwargs))
            return self.target(*args, **kwargs)
        return construct(self.target, config)


def source_of(module: Any, module_args: Any = (), module_kwargs: Any = None) -> ModuleSource:
    """``from_ptl``'s arguments as a :class:`ModuleSource`, checked (on the driver)."""
    args, kwargs = _arguments(module_args, module_kwargs)
    if isinstance(module, type):
        base = find_base(module, "LightningModule")
        if base is None:
            raise NotALightningModuleError(
                f"TrainingOperator.from_ptl takes a LightningModule subclass (from "
                f"pytorch_lightning or lightning.pytorch), an instance of one, or a factory "
                f"returning one; {module.__name__} is not a LightningModule. Subclass "
                "pytorch_lightning.LightningModule, or use a TrainingOperator subclass for a plain "
                "torch.nn.Module.")
        check_version(base)
        source = ModuleSource("class", module, args, kwargs)
        check_constructor(source)
        return source
    if find_base(type(module), "LightningModule") is not None:
        check_version(find_base(type(module), "LightningModule"))
        _no_arguments(args, kwargs, f"an instance ({type(module).__name__}) is shipped as built")
        return ModuleSource("instance", module)
    if callable(module) and not isinstance(module, nn.Module):
        _no_arguments(args, kwargs, "a factory is called as factory(config)")
        _bind(module, (dict(),), {}, f"the factory {_callable_name(module)}", "(config,)")
        return ModuleSource("factory", module)
    raise NotALightningModuleError(
        f"TrainingOperator.from_ptl takes a LightningModule subclass (from pytorch_lightning or "
        f"lightning.pytorch), an instance of one, or a factory called with config that returns "
        f"one; got {module!r}.")


def check_constructor(source: ModuleSource) -> None:
    """Whether the class's constructor takes what raysgd will pass; raises ConfigError if not."""
    cls = source.target
    if not source.legacy:
        _bind(cls, source.args, source.kwargs, cls.__name__,
              f"module_args={source.args!r}, module_kwargs={source.kwargs!r}")
        return
    params = _parameters(cls)
    if params is None or "config" in params:
        return
    required = [p for p in params.values() if p.default is p.empty
                and p.kind in (*POSITIONAL, inspect.Parameter.KEYWORD_ONLY)]
    if not required:
        return
    misfit = len(required) > 1 or required[0].kind is inspect.Parameter.KEYWORD_ONLY or (
        isinstance(required[0].annotation, type) and issubclass(required[0].annotation,
                                                                NOT_A_CONFIG))
    if misfit:
        raise ConfigError(
            f"from_ptl({cls.__name__}): {cls.__name__}{_signature(cls)} needs "
            f"{', '.join(p.name for p in required)}, but given the class alone raysgd builds it "
            f"as {cls.__name__}(config) (Ray 1.12 passed config= by keyword or nothing; raysgd also "
            f"passes the trainer's config dict as the only positional argument). To build it with its own arguments, {STYLES.format(name=cls.__name__)}.")


def construct(cls: type, config: dict, fix: Optional[str] = None) -> Any:
    """``cls(config=config)``, ``cls(config)`` or ``cls()``, whichever its constructor takes.

    A parameter named ``config`` gets the config by keyword; otherwise a required
    positional parameter gets it (a guess: when it fails, the error says what
    raysgd passed, and ``fix`` or the other ways to build a module); a constructor with
    neither is called bare.
    """
    params = _parameters(cls)
    if params is None:  # a C-level or odd __init__: legacy passed the config
        return cls(config)
    if "config" in params:
        return cls(config=config)
    required = [p for p in params.values() if p.kind in POSITIONAL and p.default is p.empty]
    if not required:
        return cls()
    try:
        return cls(config)
    except Exception as error:
        raise ConfigError(
            f"Building {cls.__name__}{_signature(cls)} as {cls.__name__}(config) failed: "
            f"{type(error).__name__}: {error}. Given the class alone, raysgd passes the "
            f"trainer's config dict ({_short(config)}) as '{required[0].name}' (raysgd's "
            f"extension of Ray 1.12's rule). If {cls.__name__} takes something else, "
            f"{fix or STYLES.format(name=cls.__name__)}.") from error


def _arguments(module_args: Any, module_kwargs: Any) -> Tuple[tuple, Dict[str, Any]]:
    if not isinstance(module_args, (tuple, list)):
        raise ConfigError(f"from_ptl(module_args=...) takes a tuple of positional arguments, got "
                          f"{module_args!r}; write module_args=({module_args!r},).")
    if module_kwargs is not None and not isinstance(module_kwargs, Mapping):
        raise ConfigError(f"from_ptl(module_kwargs=...) takes a dict of keyword arguments, got "
                          f"{type(module_kwargs).__name__}.")
    return tuple(module_args), dict(module_kwargs or {})


def _no_arguments(args: tuple, kwargs: dict, why: str) -> None:
    if args or kwargs:
        raise ConfigError(f"from_ptl(module_args=..., module_kwargs=...) apply to a "
                          f"LightningModule class only; {why}.")


def _bind(target: Any, args: tuple, kwargs: dict, name: str, passed: str) -> None:
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return  # nothing to check against; the call itself will tell
    try:
        signature.bind(*args, **kwargs)
    except TypeError as error:
        raise ConfigError(f"from_ptl: {name}{signature} cannot be called with {passed}: "
                          f"{error}. Pass arguments that match its signature.") from None


def _parameters(cls: type) -> Optional[Mapping[str, inspect.Parameter]]:
    try:
        try:  # string annotations (from __future__ import annotations) resolved when possible
            return inspect.signature(cls, eval_str=True).parameters
        except Exception:  # noqa: BLE001 - an annotation that does not evaluate here
            return inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return None


def _signature(cls: type) -> str:
    try:
        return str(inspect.signature(cls))
    except (TypeError, ValueError):
        return "(...)"


def _callable_name(target: Any) -> str:
    return getattr(target, "__qualname__", None) or repr(target)


def _short(config: dict) -> str:
    text = repr(config)
    return text if len(text) <= 80 else text[:77] + "..."
