"""Empty containers for dataclass fields (`field(default_factory=new_list)`): the builtins themselves, typed
so that strict pyright takes a field's items from its annotation instead of an unknown `list()`."""

from collections.abc import Callable
from typing import Any

new_list: Callable[[], list[Any]] = list
new_dict: Callable[[], dict[Any, Any]] = dict
new_set: Callable[[], set[Any]] = set
