"""The workers' workflow runner: the SDK's sandbox, without the round trips into the sandbox that
ask each payload's serialization context when nothing would read it.

Around every workflow activation the SDK's worker visits each payload sequence six times (codec
and external storage: decode, retrieve, reference-decode; then encode, store, reference-encode),
and each visit asks the workflow instance for that command's serialization context (and the
store visit also for its external-store context). A sandboxed instance answers by executing a
line of code inside its sandbox: compiled anew, with the sandbox's importer applied and removed.
A profile of the engine worker put those calls at about 2.4 ms on the stack per plain job, the
largest part of the sandbox's cost after the run's own module import.

The contexts are read only by a payload codec and by external storage (the payload converter
proper gets its context inside the workflow). The engine's data converter has neither, so the
answers change nothing: with `None` the SDK uses the context-free converter, which is the same
converter. `ContextFreeRunner` wraps the sandboxed runner and answers those two questions
outside the sandbox, but only for a converter without a codec and without external storage;
with either, every question goes to the sandbox as before. Everything else (the run, its
activations, the sandbox's checks) is the wrapped runner's.
"""

from __future__ import annotations

from collections.abc import Sequence

import temporalio.bridge.proto.workflow_activation
import temporalio.bridge.proto.workflow_completion
import temporalio.workflow
from temporalio.converter import DataConverter, SerializationContext, StorageDriverStoreContext
from temporalio.worker import WorkflowInstance, WorkflowInstanceDetails, WorkflowRunner
from temporalio.worker._command_aware_visitor import CommandInfo
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

Activation = temporalio.bridge.proto.workflow_activation.WorkflowActivation
Completion = temporalio.bridge.proto.workflow_completion.WorkflowActivationCompletion


def contexts_unread(converter: DataConverter) -> bool:
    """Whether nothing in `converter` reads a payload's serialization or store context."""
    return converter.payload_codec is None and converter.external_storage is None


class _ContextFreeInstance(WorkflowInstance):
    """A workflow instance whose payload contexts are answered outside its sandbox."""

    def __init__(self, inner: WorkflowInstance) -> None:
        self._inner = inner

    def activate(self, act: Activation) -> Completion:
        return self._inner.activate(act)

    def get_serialization_context(
        self, command_info: CommandInfo | None
    ) -> SerializationContext | None:
        return None  # the context-free converter: the same one, as nothing reads a context

    def get_external_store_context(
        self, command_info: CommandInfo | None
    ) -> StorageDriverStoreContext:
        return StorageDriverStoreContext(target=None)  # unread: no external storage

    def get_info(self) -> temporalio.workflow.Info:
        return self._inner.get_info()

    def get_thread_id(self) -> int | None:
        return self._inner.get_thread_id()  # the deadlock detector's view of the run


class ContextFreeRunner(WorkflowRunner):
    """`inner`'s instances, their payload contexts answered outside the sandbox when
    `converter` reads none (see the module's docstring); otherwise `inner`'s as they are."""

    def __init__(self, inner: SandboxedWorkflowRunner, converter: DataConverter) -> None:
        self.inner = inner
        self.shortcut = contexts_unread(converter)

    def prepare_workflow(self, defn: temporalio.workflow._Definition) -> None:
        self.inner.prepare_workflow(defn)

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        instance = self.inner.create_instance(det)
        return _ContextFreeInstance(instance) if self.shortcut else instance

    def set_worker_level_failure_exception_types(
        self, types: Sequence[type[BaseException]]
    ) -> None:
        self.inner.set_worker_level_failure_exception_types(types)
