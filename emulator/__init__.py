"""A local emulator of the Cloud TPU API (google.cloud.tpu.v2) with real SSH hosts.

    from emulator import Emulator
    with Emulator(state_dir=tmp) as emu:
        emu.endpoint      # "127.0.0.1:PORT" for LEDGER_TPU_ENDPOINT
        emu.rest_url      # "http://127.0.0.1:PORT", the same API over REST (gcloud)
        emu.preempt("my-node")

See docs in `emulator/core.py` (Emulator), `emulator/cloud.py` (behaviour, faults),
`emulator/api.py` (the methods both surfaces serve), `emulator/grpc_api.py`,
`emulator/rest_api.py` and `emulator/control.py` (the HTTP control API used by
`ledger emulator ...`).
"""

from emulator.cloud import Timings
from emulator.control import ControlClient, ControlError
from emulator.core import Emulator
from emulator.errors import ApiError

__all__ = ["ApiError", "ControlClient", "ControlError", "Emulator", "Timings"]
