"""Device policies: how fences, stream waits and host copies work per device type.

Generated maps never name ``torch.cuda``; they hold a ``Fence`` and ``HostMirror``s
from this module, which pick a policy by device type:

- ``cuda``: device-side wait; host copies go through a private copy stream into a
  pinned mirror so the scheduler blocks on that copy only, not the whole forward.
- ``cuda`` on a ROCm build (HIP): the host blocks on the event instead of a
  device-side wait, which hurt latency there.
- ``cpu``: synchronous, or a ``ThreadStream`` worker (see ``relay.cpu_stream``).
- anything else ``torch.get_device_module`` knows (``xpu``, ``mps``, ...): its own
  ``current_stream()`` and ``Event``.

``register_policy`` lets an engine install its own.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from typing import Any, Protocol

import torch

from relay.cpu_stream import CpuEvent, current_cpu_stream

__all__ = [
    "CpuFence",
    "CpuPolicy",
    "CudaPolicy",
    "DevicePolicy",
    "Fence",
    "GenericPolicy",
    "HipPolicy",
    "HostMirror",
    "new_fence",
    "policy_for",
    "register_policy",
]


class DevicePolicy(Protocol):
    """What a ``Fence`` and a ``HostMirror`` need from a device type."""

    def current_stream(self) -> Any:
        """The stream the calling code enqueues on (``None`` where there is none)."""

    def new_event(self) -> Any:
        """A fresh reusable event."""

    def record(self, event: Any, stream: Any) -> None:
        """Record ``event`` on ``stream``."""

    def stream_wait(self, stream: Any, event: Any) -> None:
        """Order ``stream`` after the newest record of ``event``."""

    def wait(self, event: Any) -> None:
        """Order the reader (the scheduler's current stream, or the host) after ``event``."""

    def to_host(self, src: torch.Tensor, mirror: HostMirror) -> torch.Tensor:
        """A host tensor with the values of ``src`` that no later relay write changes,
        never ``src`` itself (Note [CPU host mirror])."""


class CpuPolicy:
    """CPU: ops are synchronous; a ``ThreadStream`` makes the forward asynchronous."""

    def current_stream(self) -> Any:
        return current_cpu_stream()

    def new_event(self) -> Any:
        return CpuEvent()

    def record(self, event: Any, stream: Any) -> None:
        event.record()

    def stream_wait(self, stream: Any, event: Any) -> None:
        event.wait()

    def wait(self, event: Any) -> None:
        event.synchronize()

    def to_host(self, src: torch.Tensor, mirror: HostMirror) -> torch.Tensor:
        # Note [CPU host mirror]
        return src.clone()


class _SynchronizingEvent:
    """For device modules without streams and events: a record synchronizes the device,
    so everything before it is complete and waits have nothing left to do."""

    def __init__(self, module: Any) -> None:
        self.module = module

    def record(self, stream: Any = None) -> None:
        self.module.synchronize()

    def wait(self, stream: Any = None) -> None:
        pass

    def synchronize(self) -> None:
        pass


def _takes_device(function: Callable[..., Any]) -> bool:
    """Whether ``function`` accepts a device as its first argument."""
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: do not guess
        return False
    return bool(parameters) and parameters[0].kind in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    )


class GenericPolicy:
    """Any other device module (xpu, mps, ...): its ``current_stream()`` and ``Event``,
    or a device synchronize where the module has no streams."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.module: Any = torch.get_device_module(device.type)
        self._streams = hasattr(self.module, "current_stream") and hasattr(
            self.module, "Event"
        )
        # The map's own device's stream (a map on xpu:1 records and waits on xpu:1's),
        # where the module's current_stream takes a device.
        self._per_device = self._streams and _takes_device(self.module.current_stream)

    def current_stream(self) -> Any:
        if not self._streams:
            return None
        if self._per_device:
            return self.module.current_stream(self.device)
        return self.module.current_stream()

    def new_event(self) -> Any:
        return (
            self.module.Event() if self._streams else _SynchronizingEvent(self.module)
        )

    def record(self, event: Any, stream: Any) -> None:
        event.record(stream)

    def stream_wait(self, stream: Any, event: Any) -> None:
        if stream is None:
            event.synchronize()
        else:
            stream.wait_event(event)

    def wait(self, event: Any) -> None:
        self.stream_wait(self.current_stream(), event)

    def to_host(self, src: torch.Tensor, mirror: HostMirror) -> torch.Tensor:
        return src.to("cpu")


class CudaPolicy(GenericPolicy):
    """CUDA: device-side waits, and host copies through a private copy stream."""

    def __init__(self, device: torch.device) -> None:
        super().__init__(device)
        self._copy_stream: Any = None

    def to_host(self, src: torch.Tensor, mirror: HostMirror) -> torch.Tensor:
        if self._copy_stream is None:
            self._copy_stream = self.module.Stream(device=self.device)
        copy_stream = self._copy_stream
        pinned = mirror.pinned_rows(src)
        copy_stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(copy_stream):
            pinned.copy_(src, non_blocking=True)
            # ``src`` may be freed by the caller before the copy stream reads it.
            src.record_stream(copy_stream)
            mirror.copy_done.record(copy_stream)
        mirror.copy_done.synchronize()
        # The pinned rows are reused by the next copy: hand out a private tensor.
        return pinned.clone()


class HipPolicy(CudaPolicy):
    """ROCm: block the host on the event; a device-side wait hurt latency there."""

    def wait(self, event: Any) -> None:
        event.synchronize()


_FACTORIES: dict[str, Callable[[torch.device], DevicePolicy]] = {}
_POLICIES: dict[torch.device, DevicePolicy] = {}


def register_policy(
    device_type: str, factory: Callable[[torch.device], DevicePolicy]
) -> None:
    """Use ``factory(device)`` for every map on ``device_type`` created from now on."""
    _FACTORIES[device_type] = factory
    for device in [d for d in _POLICIES if d.type == device_type]:
        del _POLICIES[device]


def _default_policy(device: torch.device) -> DevicePolicy:
    if device.type == "cpu":
        return CpuPolicy()
    if device.type == "cuda":
        return (
            HipPolicy(device) if torch.version.hip is not None else CudaPolicy(device)
        )
    return GenericPolicy(device)


def policy_for(device: torch.device) -> DevicePolicy:
    """The policy of ``device``, created on first use."""
    policy = _POLICIES.get(device)
    if policy is None:
        factory = _FACTORIES.get(device.type, _default_policy)
        policy = _POLICIES[device] = factory(device)
    return policy


# Note [CPU host mirror]
# A resolve sets the device target (``seq_lens``) and its host mirror (``seq_lens_cpu``,
# "a host copy of it"). On the CPU the gathered tensor already lives on the host, and
# handing it over as the mirror too (as sglang's ``.cpu()`` does) made the two one
# tensor: an engine that advances both in place between steps
# (``seq_lens.add_(1); seq_lens_cpu.add_(1)``, as schedulers do) counted twice. So the
# mirror is a copy on every device. It is a fresh tensor, not a preallocated one
# written each step: the batch keeps it after the next resolve (the scheduler may
# still read step N's lengths while step N+1 resolves), as on CUDA, where the pinned
# rows are cloned for the same reason. One ``clone`` per resolve; its cost is in
# docs/schema.md ("Host mirrors").


class HostMirror:
    """Per-field host-copy state: a pinned buffer (CUDA) reused across resolves."""

    copy: Callable[[torch.Tensor], torch.Tensor]
    """``src`` on the host, in a tensor the caller owns: never ``src`` itself, so
    changing one in place leaves the other alone (Note [CPU host mirror]). With the
    stock CPU policy it is ``Tensor.clone`` itself: the resolve's call is the op."""

    def __init__(self, device: torch.device, pool_size: int) -> None:
        self.device = device
        self.pool_size = pool_size
        self._policy = policy_for(device)
        self._pinned: torch.Tensor | None = None
        self._copy_done: Any = None
        bare = type(self._policy) is CpuPolicy
        self.copy = torch.Tensor.clone if bare else self._to_host

    def pinned_rows(self, like: torch.Tensor) -> torch.Tensor:
        """Pinned host rows shaped like ``like`` (allocated on first use; needs CUDA)."""
        pinned = self._pinned
        rows = like.shape[0]
        if (
            pinned is None
            or pinned.dtype != like.dtype
            or pinned.shape[1:] != like.shape[1:]
            or pinned.shape[0] < rows  # padded batches may hold more rows than slots
        ):
            pinned = torch.empty(
                (max(self.pool_size, rows), *like.shape[1:]),
                dtype=like.dtype,
                pin_memory=True,
            )
            self._pinned = pinned
        return pinned[:rows]

    @property
    def copy_done(self) -> Any:
        """The event the host waits on for the copy alone."""
        if self._copy_done is None:
            self._copy_done = self._policy.new_event()
        return self._copy_done

    def _to_host(self, src: torch.Tensor) -> torch.Tensor:
        return self._policy.to_host(src, self)


# Note [Fence chaining]
# One event is reused for every publish. If a second stream records it while an
# earlier record is still in flight, the event forgets the earlier point and a
# reader waiting on it no longer waits for the first publisher's writes. So before
# recording, a stream other than the previous recorder first waits on the previous
# record: the new record then covers both.


class Fence:
    """The schedule lane's ``publish_ready`` event: created lazily, records chained.

    Debug-mode freshness (a wait with no publish before it) is ``relay.debug``'s job.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._policy = policy_for(device)
        self._event: Any = None
        self._stream: Any = None
        self._recorded = False
        # The first publish may run on a worker while the scheduler's first wait
        # creates the event: one of them must create it, once.
        self._create = threading.Lock()

    @property
    def created(self) -> bool:
        """Whether the event exists yet (it is made on the first publish or wait)."""
        return self._event is not None

    def _get_event(self) -> Any:
        with self._create:
            if self._event is None:
                self._event = self._policy.new_event()
        return self._event

    def record(self) -> None:
        """Mark the point the current stream has reached (end of a publish)."""
        policy = self._policy
        if type(policy) is CpuPolicy:
            # The event chains in host order (Note [Fence chaining in host order] in
            # relay/cpu_stream.py), whichever worker runs first.
            event = self._event if self._event is not None else self._get_event()
            event.record_chained()
            return
        stream = policy.current_stream()
        event = self._event
        if event is None:
            event = self._get_event()
        elif stream != self._stream and self._recorded:
            # Note [Fence chaining]
            policy.stream_wait(stream, event)
        policy.record(event, stream)
        self._stream = stream
        self._recorded = True

    def wait(self) -> None:
        """Order the reader after the newest publish, per the device policy."""
        # Wait first: on a CPU worker stream the publish this wait refers to may not
        # have run yet (Note [Host order of CPU records]).
        event = self._event
        self._policy.wait(event if event is not None else self._get_event())

    def wait_on_stream(self) -> None:
        """Order the calling stream after the newest publish with a device-side wait,
        whatever the policy's ``wait`` does (HIP's blocks the host): a stream-ordered
        read."""
        event = self._event
        policy = self._policy
        stream = policy.current_stream()
        policy.stream_wait(stream, event if event is not None else self._get_event())


# Note [Bare CPU fence]
# On the CPU a ``CpuEvent`` needs none of ``Fence``'s work: ops are synchronous, there is
# no stream to look up for a record, and Note [Fence chaining] is built into the event
# (it keeps the newest record per stream, and a wait waits for every live stream's
# newest task whichever stream recorded), so a second publishing stream cannot make it
# forget the first. A debug-off map on the CPU therefore gets a ``CpuFence``: its first
# ``record`` or ``wait`` makes the event and rebinds both to the event's own methods, so
# every later call is the bare ``CpuEvent.record`` / ``synchronize``. Debug mode keeps ``Fence``: its happens-before clocks model the fence as
# CUDA does (a new record replaces the old), so they must see the chaining wait. So
# does a CPU device whose policy is not the stock ``CpuPolicy`` (a registered one).


class CpuFence:
    """The fence of a debug-off map on the CPU (Note [Bare CPU fence])."""

    record: Callable[[], None]
    """Mark the point the calling thread's stream has reached (end of a publish)."""
    wait: Callable[[], None]
    """Block until the newest record has completed."""

    def __init__(self) -> None:
        self._made: CpuEvent | None = None
        self._create = threading.Lock()
        self.record = self._first_record
        self.wait = self._first_wait

    @property
    def created(self) -> bool:
        """Whether the event exists yet (it is made on the first publish or wait)."""
        return self._made is not None

    def _event(self) -> CpuEvent:
        # The first publish may run on a worker while the first wait runs on the
        # scheduler: one of them makes the event, once.
        with self._create:
            event = self._made
            if event is None:
                event = self._made = CpuEvent()
                self.record, self.wait = event.record, event.synchronize
            return event

    def _first_record(self) -> None:
        self._event().record()

    def _first_wait(self) -> None:
        self._event().synchronize()

    def wait_on_stream(self) -> None:
        """As ``wait``: CPU work is ordered by the host (a worker stream's task waits in
        its own order)."""
        self.wait()


def new_fence(device: torch.device, debug: bool) -> Fence | CpuFence:
    """The schedule lane's fence of a map on ``device`` (Note [Bare CPU fence])."""
    if not debug and type(policy_for(device)) is CpuPolicy:
        return CpuFence()
    return Fence(device)
