# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""allocator_conf: PYTORCH_CUDA_ALLOC_CONF rendered from a dict and checked key by key, so that an
option PyTorch would refuse stops the deployment instead of the engine's start-up."""

from __future__ import annotations

import re
from typing import Callable, NamedTuple


class AllocatorOption(NamedTuple):
    since: tuple[int, int]  # the first torch (major, minor) whose allocator knows the key
    problem: Callable[[str], str | None]  # what is wrong with a value, None when it is right


def _boolean_problem(value: str) -> str | None:
    # PyTorch compares the text exactly: true, 1 or yes are refused.
    return None if value in ("True", "False") else "it must be True or False, in exactly that case"


def _split_size_problem(value: str) -> str | None:
    # Most torch releases require more than 20 (the large-block buffer); only the newest accept
    # 20 itself, so 20 is refused to stay valid on an older vendor torch.
    if value.isdigit() and int(value) > 20:
        return None
    return "it must be a whole number of MB above 20"


def _fraction_problem(value: str) -> str | None:
    try:
        inside = 0 < float(value) < 1
    except ValueError:
        inside = False
    return None if inside else "it must be a number between 0 and 1, both excluded"


def _backend_problem(value: str) -> str | None:
    if value in ("native", "cudaMallocAsync"):
        return None
    return "it must be native or cudaMallocAsync"


def _whole_number_problem(value: str) -> str | None:
    return None if value.isdigit() else "it must be a whole number of MB"


def _register_threads_problem(value: str) -> str | None:
    if _is_power_of_two(value) and int(value) <= 128:
        return None
    return "it must be a power of 2 no larger than 128"


def _roundup_problem(value: str) -> str | None:
    if _is_power_of_two(value):
        return None
    intervals = re.fullmatch(r"\[(.*)\]", value)
    if intervals and all(_is_roundup_interval(item) for item in intervals.group(1).split(",")):
        return None
    return (
        "it must be a power of 2, or intervals such as [256:1,512:2,>:8] whose sizes (MB) and "
        "divisions are powers of 2, > standing for every larger size"
    )


def _is_roundup_interval(item: str) -> bool:
    size, colon, divisions = item.partition(":")
    return bool(colon) and (size == ">" or _is_power_of_two(size)) and _is_power_of_two(divisions)


def _is_power_of_two(text: str) -> bool:
    return text.isdigit() and int(text) > 0 and int(text) & (int(text) - 1) == 0


# PyTorch's CUDA caching allocator options. `since` is the release whose documentation first lists
# the key, rounded to the minor version: expandable_segments:True failing on 2.0.1 and 1.13.1
# confirms 2.1; max_non_split_rounding_mb was merged in September 2024 (2.6); the other versions
# are approximate, and a vendor build may differ from upstream by a release.
ALLOCATOR_OPTIONS = {
    "max_split_size_mb": AllocatorOption((1, 10), _split_size_problem),
    "garbage_collection_threshold": AllocatorOption((1, 12), _fraction_problem),
    "roundup_power2_divisions": AllocatorOption((1, 13), _roundup_problem),
    "backend": AllocatorOption((2, 0), _backend_problem),
    "expandable_segments": AllocatorOption((2, 1), _boolean_problem),
    "release_lock_on_cudamalloc": AllocatorOption((2, 2), _boolean_problem),
    "pinned_use_cuda_host_register": AllocatorOption((2, 2), _boolean_problem),
    "pinned_num_register_threads": AllocatorOption((2, 2), _register_threads_problem),
    "pinned_use_background_threads": AllocatorOption((2, 5), _boolean_problem),
    "max_non_split_rounding_mb": AllocatorOption((2, 6), _whole_number_problem),
}


def allocator_conf(options: dict) -> str:
    """Render the options as `key:value,...`, keys in alphabetical order.

    Booleans become True/False; a dict (for roundup_power2_divisions) becomes the bracketed
    interval form, in the dict's own order.
    """
    return ",".join(f"{key}:{_text(options[key])}" for key in sorted(options))


def _text(value) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, dict):
        return "[" + ",".join(f"{size}:{_text(count)}" for size, count in value.items()) + "]"
    return str(value)


def allocator_conf_problems(value: str | dict, *, torch_version: str | None = None) -> list[str]:
    """Return every problem of PYTORCH_CUDA_ALLOC_CONF, one sentence each (empty = accepted).

    With torch_version (the host's torch.__version__), a key that torch does not know yet is a
    problem too.
    """
    conf = allocator_conf(value) if isinstance(value, dict) else value
    if torch_version is not None and _minor_version(torch_version) is None:
        return [f"torch version {torch_version!r} does not start with major.minor"]
    return [
        problem for entry in _entries(conf) for problem in _entry_problems(entry, torch_version)
    ]


def _minor_version(torch_version: str) -> tuple[int, int] | None:
    found = re.match(r"(\d+)\.(\d+)", torch_version)
    return (int(found.group(1)), int(found.group(2))) if found else None


def _entries(conf: str) -> list[str]:
    """The comma-separated entries, keeping the commas inside [...] with their entry.

    PyTorch drops spaces anywhere in the variable, so they are dropped here too.
    """
    return re.findall(r"(?:\[[^\]]*\]?|[^,\[])+", conf.replace(" ", ""))


def _entry_problems(entry: str, torch_version: str | None) -> list[str]:
    key, colon, value = entry.partition(":")
    option = ALLOCATOR_OPTIONS.get(key)
    refusal = f'PyTorch fails at start-up with "Unrecognized CachingAllocator option: {key}"'
    if option is None:
        return [f"PYTORCH_CUDA_ALLOC_CONF: {key} is not an allocator option: {refusal}"]
    if torch_version is not None and _minor_version(torch_version) < option.since:
        since = ".".join(map(str, option.since))
        return [
            f"PYTORCH_CUDA_ALLOC_CONF: {key} needs torch {since} or later and the host has "
            f"{torch_version}: {refusal}"
        ]
    if not colon:
        return [f"PYTORCH_CUDA_ALLOC_CONF: {key} has no value: the form is {key}:<value>"]
    problem = option.problem(value)
    return [f"PYTORCH_CUDA_ALLOC_CONF: {key} is {value}: {problem}"] if problem else []
