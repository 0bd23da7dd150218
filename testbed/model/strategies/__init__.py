"""One predictor per strategy: a cell's steps simulated on the network with the calibrated transport.

Each predictor takes a CellModel (options, network, transport, compute per micro-batch) and returns a
Prediction: mean step, compute, exposed communication, bubble, payload bytes per inter-DC link direction
and per step, and a sentence that says where the time goes. Steps are simulated one after the other (TCP
windows carry over and restart after idle gaps, as they do on the real links) and averaged over the
measured steps, as the collectors average the measured ones.

Extension point: PREDICTORS maps a workload strategy name (testbed.spec.strategies.STRATEGIES, the one list of
names) to its function; a new strategy adds one function to its family's module here (base, dp, torch_native,
pipeline, diloco, as in testbed.workload.strategies) that composes the collectives in testbed.model.collectives,
and one entry below.
"""

from __future__ import annotations

from collections.abc import Callable

from testbed.model.strategies.base import CellModel, Prediction
from testbed.model.strategies.base import _all_reduce_bytes as _all_reduce_bytes  # read by calibration
from testbed.model.strategies.diloco import async_diloco, diloco, streaming_diloco
from testbed.model.strategies.dp import flat_dp, hier_dp, hier_dp_overlap
from testbed.model.strategies.pipeline import pipeline
from testbed.model.strategies.torch_native import ddp, fsdp, hsdp
from testbed.model.strategies.torchft import torchft_ddp, torchft_diloco, torchft_streaming_diloco

PREDICTORS: dict[str, Callable[[CellModel], Prediction]] = {
    "flat-dp": flat_dp,
    "hier-dp": hier_dp,
    "hier-dp-overlap": hier_dp_overlap,
    "pp": pipeline,
    "diloco": diloco,
    "streaming-diloco": streaming_diloco,
    "async-diloco": async_diloco,
    "ddp": ddp,
    "fsdp": fsdp,
    "hsdp": hsdp,
    "torchft-ddp": torchft_ddp,
    "torchft-diloco": torchft_diloco,
    "torchft-streaming-diloco": torchft_streaming_diloco,
}


def predict(m: CellModel) -> Prediction:
    """The prediction for a cell; KeyError names a strategy the model does not cover yet."""
    try:
        predictor = PREDICTORS[m.opts.strategy]
    except KeyError:
        raise KeyError(f"the cost model has no predictor for strategy {m.opts.strategy!r} "
                       f"(covered: {', '.join(PREDICTORS)})") from None
    prediction = predictor(m)
    prediction.step_s += m.step_overhead_s
    return prediction


__all__ = ["PREDICTORS", "CellModel", "Prediction", "predict"]
