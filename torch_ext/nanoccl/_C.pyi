"""Type stubs of nanoccl._C (torch_ext/module.cc)."""

from typing import Any

from torch._C._distributed_c10d import Backend, Store

class ProcessGroupNanoccl(Backend):
    def stats(self) -> Any: ...
    @property
    def comm_id(self) -> str: ...

def create_backend(
    store: Store,
    rank: int,
    size: int,
    timeout_ms: int,
    group_name: str,
    global_ranks: list[int],
    settings: dict[str, str],
) -> ProcessGroupNanoccl: ...
def check_setting(name: str, value: str) -> None: ...
def default_settings() -> list[tuple[str, str]]: ...
