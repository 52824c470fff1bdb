"""What a job may ask for: every number's accepted range and every input's size, in one place.

The ranges are generous for production work and refuse what no real job needs but a typo or an
attacker can send: 1e6 replicas would start a million processes, a memory of ``1e400`` is infinity,
a deadline of 1e30 overflows every clock. The README's job reference lists the same table.

==========================  =====================================================================
field                       accepted
==========================  =====================================================================
resources.replicas          1 to 4096 (a large multi-node training job; more is a fleet, not a job)
resources.device.count      0 to 256 per replica (0 for cpu; at least 1 for gpu and tpu)
resources.cpu               0 (the backend's default) to 1024 cores per replica, finite
resources.memory            0 to 32 TiB per replica (bytes, or a quantity such as ``64Gi``)
scheduling_deadline_ms      0 to 4102444800000: epoch milliseconds before 2100-01-01T00:00:00Z
constraint numbers          -2**53 to 2**53, finite (what every JSON reader keeps exactly)
job_id                      at most 512 characters (the rule: ``core/job_ids.py``)
command                     at most 4096 arguments, each at most 131071 bytes
env                         at most 1024 variables; a name at most 256 characters, a value at
                            most 131071 bytes; command and env together at most 1 MiB
image                       at most 1024 characters
names                       device variant, regions (at most 64), target_cluster, constraint
                            keys and string values: at most 256 characters each
constraints                 at most 64, each with at most 256 values
files                       at most 256 files and 10 MiB in all; a path at most 1024 bytes, each
                            of its segments at most 255 (the rule: ``core/job_files.py``)
==========================  =====================================================================

The exec limits are Linux's: one argument or variable is at most 128 KiB with its NUL
(``MAX_ARG_STRLEN``), and arguments and environment together usually at most 2 MiB (``ARG_MAX``),
of which a job may use half: the backend adds its own variables.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pydantic_core import PydanticCustomError

MAX_REPLICAS = 4096
MAX_DEVICES_PER_REPLICA = 256
MAX_CPU_PER_REPLICA = 1024
MAX_MEMORY_PER_REPLICA = 32 * 2**40
LATEST_DEADLINE_MS = 4_102_444_800_000  # 2100-01-01T00:00:00Z
MAX_START_TIMEOUT_SECONDS = 366 * 24 * 3600  # a year: longer is no timeout, and 0 says that
MAX_CONSTRAINT_NUMBER = 2**53

MAX_JOB_ID_LENGTH = 512
MAX_COMMAND_ARGUMENTS = 4096
MAX_ARGUMENT_BYTES = 128 * 1024 - 1
MAX_ENV_VARIABLES = 1024
MAX_ENV_NAME_LENGTH = 256
MAX_EXEC_BYTES = 2**20
MAX_IMAGE_LENGTH = 1024
MAX_NAME_LENGTH = 256
MAX_REGIONS = 64
MAX_PREFERRED_VARIANTS = 16  # device variants a job may prefer room for (core/model.py ``prefer``)
MAX_CONSTRAINTS = 64
MAX_CONSTRAINT_VALUES = 256
MAX_FILES = 256
MAX_FILES_BYTES = 10 * 2**20  # what a handoff carries inline; anything bigger belongs in an object store
MAX_FILE_PATH_BYTES = 1024
MAX_FILE_SEGMENT_BYTES = 255  # NAME_MAX of Linux file systems


@dataclass(frozen=True, slots=True)
class NumberRange:
    """An accepted range, and the ``before`` validator that holds a field to it.

    The validator refuses what pydantic's own number checks would mis-handle or let through: a
    boolean (``true`` is not one replica), a non-finite number, and anything above ``high``
    (including numbers too large to convert). What is below ``low`` is left to the field's own
    ``ge``, so its message stays ``must be >= 1``.
    """

    low: int | float
    high: int | float
    unit: str  # what the number counts: "replicas per job", "cores per replica"

    def describe(self) -> str:
        return f"between {_plain(self.low)} and {_plain(self.high)} {self.unit}"

    def refuse(self, got: str) -> PydanticCustomError:
        return PydanticCustomError(
            "number_range", "must be a number {range}, got {got}", {"range": self.describe(), "got": got}
        )

    def check(self, value: Any) -> Any:
        """A pydantic ``before`` validator for the field (other types go on to pydantic's checks)."""
        if isinstance(value, bool):
            raise self.refuse(str(value).lower())
        number = _as_number(value)
        if number is None:
            return value
        if isinstance(number, float) and not math.isfinite(number):
            raise self.refuse(shown_number(number))
        if number > self.high:
            raise self.refuse(shown_number(number))
        return value


REPLICAS = NumberRange(1, MAX_REPLICAS, "replicas per job")
DEVICES = NumberRange(0, MAX_DEVICES_PER_REPLICA, "devices per replica")
CPU = NumberRange(0, MAX_CPU_PER_REPLICA, "cores per replica")
MEMORY = NumberRange(0, MAX_MEMORY_PER_REPLICA, "bytes per replica (32Ti)")
DEADLINE = NumberRange(0, LATEST_DEADLINE_MS, "epoch milliseconds (before 2100-01-01)")
START_TIMEOUT = NumberRange(0, MAX_START_TIMEOUT_SECONDS, "seconds (0: no start timeout)")


def shown_number(number: int | float) -> str:
    """A number as an error may show it: never thousands of digits."""
    if isinstance(number, int) and number.bit_length() > 64:
        return f"a number of about {int(number.bit_length() * math.log10(2)) + 1} digits"
    return str(number)


def _as_number(value: Any) -> int | float | None:
    if isinstance(value, int | float):
        return value
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def _plain(number: int | float) -> str:
    return str(int(number)) if float(number).is_integer() else str(number)
