"""Recording real FSDP runs into the same report types as a prediction."""

from fsdpviz.record._fsdp1 import FSDP1Recorder, record_fsdp1
from fsdpviz.record._fsdp2 import FSDP2Recorder

__all__ = ["FSDP1Recorder", "FSDP2Recorder", "record_fsdp1"]
