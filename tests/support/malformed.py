"""Malformed experiment files, each with the field its one-line error must name and a word of the problem.

Each is a mistake that used to run anyway (failing its cells minutes later, or producing a gate that could
never pass) or one a user is likely to make; all can be seen before anything runs."""

from __future__ import annotations

from pathlib import Path

TWO_DC = "  name: pair\n  dcs: [{name: east, nodes: 2}, {name: west, nodes: 2}]\n" \
         "  links: [{between: [east, west], latency: 2ms, bandwidth: 1gbit}]\n"
THREE_UNEQUAL = "  name: uneven\n  dcs: [{name: a, nodes: 2}, {name: b, nodes: 1}, {name: c, nodes: 2}]\n" \
                "  links: [{between: [a, b], latency: 2ms}, {between: [b, c], latency: 2ms}]\n"


def text(strategies: str, *, workload: str = "{steps: 4, warmup_steps: 1}", sweep: str = "",
         thresholds: str = "", topology: str = TWO_DC, extra: str = "") -> str:
    out = f"name: bad\ntopology:\n{topology}workload: {workload}\nstrategies: {strategies}\ncalibrate: none\n"
    if sweep:
        out += f"sweep:\n  {sweep}\n"
    if thresholds:
        out += f"thresholds:\n  - {thresholds}\n"
    return out + extra


LATENCY = "links[east,west].latency: [1ms, 20ms]"

MALFORMED: dict[str, tuple[str, str, str]] = {
    # the six kinds of the issue
    "option_of_wrong_type": (text("[flat-dp, {name: o, strategy: hier-dp-overlap, options: {chunks: four}}]"),
                             "strategies[1].options.chunks", "expected a whole number, got 'four'"),
    "sweep_value_out_of_range": (text("[flat-dp]", sweep="workload.micro_batches: [2, 0]"),
                                 "sweep.workload.micro_batches[1]", "must be at least 1, got 0"),
    "negative_inner_steps": (text("[{name: d, strategy: diloco, options: {inner_steps: -5}}]"),
                             "strategies[0].options.inner_steps", "must be at least 1, got -5"),
    "virtual_chunks_beyond_the_model": (
        text("[{name: p, strategy: pp, options: {schedule: interleaved-1f1b, virtual_chunks: 4}}]"),
        "strategies[0].options.virtual_chunks", "2 stages x 4 chunks = 8 pipeline chunks"),
    "where_value_no_cell_has": (text("[flat-dp]", sweep=LATENCY,
                                     thresholds="{metric: tokens_per_s, strategy: flat-dp, where: {latency: 30ms}, min: 1}"),
                                "thresholds[0].where.latency", "no cell has links[east,west].latency = 30ms"),
    "threshold_strategy_not_run": (text("[flat-dp]", sweep=LATENCY,
                                        thresholds="{metric: tokens_per_s, strategy: hier-dp, min: 1}"),
                                   "thresholds[0].strategy", "'hier-dp' is not a strategy of this experiment"),
    # more of the same family
    "threshold_than_not_run": (text("[flat-dp]", thresholds="{metric: tokens_per_s, strategy: flat-dp, "
                                                           "than: diloco, min: 1}"),
                               "thresholds[0].than", "'diloco' is not a strategy"),
    "option_the_strategy_ignores": (text("[{name: f, strategy: flat-dp, options: {chunks: 4}}]"),
                                    "strategies[0].options.chunks", "flat-dp does not use it"),
    "option_the_schedule_ignores": (text("[{name: p, strategy: pp, options: {virtual_chunks: 2}}]"),
                                    "strategies[0].options.virtual_chunks", "only used with schedule"),
    "unknown_choice": (text("[{name: h, strategy: hier-dp, options: {compression: gzip}}]"),
                       "strategies[0].options.compression", "'none', 'fp16', 'bf16' or 'int8'"),
    "workload_value_out_of_range": (text("[flat-dp]", workload="{steps: 4, warmup_steps: 1, micro_batch: 0}"),
                                    "workload.micro_batch", "must be at least 1, got 0"),
    "efficiency_without_baseline": (text("[flat-dp]", thresholds="{metric: scaling_efficiency, min: 0.5}",
                                         extra="baseline: none\n"),
                                    "thresholds[0].metric", "baseline: none"),
    "bubble_of_data_parallelism": (text("[flat-dp]", thresholds="{metric: bubble_ratio, strategy: flat-dp, max: 1}"),
                                   "thresholds[0].metric", "pipelines (pp) only"),
    "replicas_apart_of_a_built_in": (text("[flat-dp]", thresholds="{metric: replicas_apart, strategy: flat-dp, max: 0}"),
                                     "thresholds[0].metric", "torchft's replica groups only, not flat-dp"),
    "where_key_not_swept": (text("[flat-dp]", sweep=LATENCY,
                                 thresholds="{metric: tokens_per_s, where: {bandwidth: 1gbit}, min: 1}"),
                            "thresholds[0].where.bandwidth", "not swept"),
    "interleaved_micro_batches_not_a_multiple": (
        text("[{name: p, strategy: pp, options: {schedule: interleaved-1f1b, virtual_chunks: 1}}]",
             workload="{steps: 4, warmup_steps: 1, micro_batches: 3}"),
        "workload.micro_batches", "multiple of the stages (2)"),
    "hier_dp_on_unequal_dcs": (text("[flat-dp, hier-dp]", topology=THREE_UNEQUAL),
                               "strategies[1]", "hier-dp needs the same number of ranks in every DC"),
    "compute_ms_with_real_compute": (text("[flat-dp]", workload="{steps: 4, warmup_steps: 1, compute_ms: 50}"),
                                     "workload.compute_ms", "only used with synthetic compute"),
    "diloco_that_never_syncs": (text("[{name: d, strategy: diloco, options: {inner_steps: 50}}]"),
                                "strategies[0].options.inner_steps", "never synchronise"),
    "swept_steps_leave_nothing_measured": (text("[flat-dp]", sweep="workload.steps: [4, 1]"),
                                           "workload.warmup_steps", "no measured step"),
    "ddp_hook_that_needs_a_gpu": (text("[{name: d, strategy: ddp, options: {comm_hook: bf16}}]"),
                                  "strategies[0].options.comm_hook", "bf16_compress_hook needs CUDA 11+ with NCCL"),
    "powersgd_over_several_ddp_buckets": (
        text("[{name: d, strategy: ddp, options: {comm_hook: powersgd, bucket_cap_mb: 0.5}}]"),
        "strategies[0].options.bucket_cap_mb", "0.904 MB of gradients, so set bucket_cap_mb >= 0.91"),
    "powersgd_rank_without_powersgd": (text("[{name: d, strategy: ddp, options: {powersgd_rank: 2}}]"),
                                       "strategies[0].options.powersgd_rank", "only used with comm_hook: powersgd"),
    "pytorch_wrapper_with_synthetic_compute": (
        text("[flat-dp, hsdp]", workload="{steps: 4, warmup_steps: 1, compute: synthetic, compute_ms: 50}"),
        "workload.compute", "hsdp communicates from inside autograd's backward"),
    "hsdp_on_unequal_dcs": (text("[flat-dp, hsdp]", topology=THREE_UNEQUAL),
                            "strategies[1]", "its 2-D DeviceMesh (DCs x ranks per DC) must be rectangular"),
    "sweep_of_an_option_nobody_reads": (text("[flat-dp]", sweep="workload.chunks: [2, 4]"),
                                        "sweep.workload.chunks", "no strategy of this experiment uses chunks"),
    # the faults: timeline (testbed.spec.faults)
    "fault_of_unknown_kind": (text("[flat-dp]", extra="faults: [{kind: meteor, between: [east, west], at: 1s}]\n"),
                              "faults[0].kind", "partition"),
    "fault_at_neither_step_nor_time": (
        text("[flat-dp]", extra="faults: [{kind: partition, between: [east, west], at: soon, duration: 1s}]\n"),
        "faults[0].at", "'step N' or a time"),
    "partition_without_duration": (text("[flat-dp]", extra="faults: [{kind: partition, between: [east, west], "
                                                            "at: step 1}]\n"),
                                   "faults[0].duration", "partition needs duration"),
    "fault_field_its_kind_ignores": (
        text("[flat-dp]", extra="faults: [{kind: partition, between: [east, west], at: 1s, duration: 1s, "
                                "loss: 5%}]\n"),
        "faults[0].loss", "partition does not take loss"),
    "fault_on_a_link_that_does_not_exist": (
        text("[flat-dp]", topology=THREE_UNEQUAL,
             extra="faults: [{kind: partition, between: [a, c], at: 1s, duration: 1s}]\n"),
        "faults[0].between", "no link between a and c"),
    "fault_on_an_unknown_dc": (text("[flat-dp]", extra="faults: [{kind: latency, between: [east, north], "
                                                       "at: 1s, duration: 1s, latency: 50ms}]\n"),
                               "faults[0].between", "no DC named 'north'"),
    "fault_rank_beyond_the_world": (text("[flat-dp]", extra="faults: [{kind: kill, rank: 4, at: step 1}]\n"),
                                    "faults[0].rank", "rank 4 does not exist"),
    "kill_of_a_rank_and_a_dc": (text("[flat-dp]", extra="faults: [{kind: kill, rank: 1, dc: east, at: step 1}]\n"),
                                "faults[0].rank", "a rank or a DC"),
    "kill_of_an_unknown_dc": (text("[torchft-ddp]", extra="faults: [{kind: kill, dc: wset, at: step 1}]\n"),
                              "faults[0].dc", "no DC named 'wset' (did you mean west?)"),
    "torchft_fragments_that_do_not_divide_inner_steps": (
        text("[{name: s, strategy: torchft-streaming-diloco, options: {inner_steps: 4, fragments: 3}}]",
             workload="{steps: 8, warmup_steps: 1}"), "strategies[0].options.fragments", "must divide inner_steps (4)"),
    "torchft_fragment_sync_delay_past_the_next_sync": (
        text("[{name: s, strategy: torchft-streaming-diloco, options: {inner_steps: 4, fragments: 2, "
             "fragment_sync_delay: 2}}]", workload="{steps: 8, warmup_steps: 1}"),
        "strategies[0].options.fragment_sync_delay", "must be less than inner_steps / fragments (2)"),
    "torchft_quorum_of_more_groups_than_dcs": (
        text("[{name: t, strategy: torchft-ddp, options: {min_replicas: 3}}]"),
        "strategies[0].options.min_replicas", "more than the 2 DCs (replica groups): no quorum could form"),
    "fault_step_never_reached": (text("[flat-dp]", extra="faults: [{kind: kill, rank: 1, at: step 4}]\n"),
                                 "faults[0].at", "step 4 is never reached"),
    "flap_down_longer_than_period": (
        text("[flat-dp]", extra="faults: [{kind: flap, between: [east, west], at: 1s, duration: 4s, "
                                "period: 1s, down: 2s}]\n"),
        "faults[0].down", "between 0 and the period"),
    "sdc_bit_beyond_float32": (text("[flat-dp]", extra="faults: [{kind: sdc, rank: 1, at: step 2, "
                                                       "target: gradient, bit: 32}]\n"),
                               "faults[0].bit", "bits 0-31"),
    "sdc_at_a_time": (text("[flat-dp]", extra="faults: [{kind: sdc, rank: 1, at: 2s, target: parameter, "
                                              "bit: 30}]\n"),
                      "faults[0].at", "injected at a step"),
    "gradient_sdc_under_powersgd": (
        text("[flat-dp, {name: psgd, strategy: ddp, options: {comm_hook: powersgd}}]",
             extra="faults: [{kind: sdc, rank: 1, at: step 2, target: gradient, bit: 30}]\n"),
        "faults[0].target", "PowerSGD's error feedback"),
    "async_diloco_checkpoints_between_syncs": (
        text("[flat-dp, {name: a, strategy: async-diloco, options: {inner_steps: 2}}]",
             extra="restarts: 2\ncheckpoint_every: 3\n"), "checkpoint_every", "a multiple of inner_steps (2"),
    "streaming_diloco_checkpoints_between_syncs_at_a_swept_inner_steps": (
        text("[flat-dp, {name: s, strategy: streaming-diloco}]", sweep="workload.inner_steps: [2, 3]",
             extra="restarts: 1\ncheckpoint_every: 4\n"), "checkpoint_every", "(at workload.inner_steps=3)"),
    "diloco_checkpoints_between_outer_steps": (
        text("[flat-dp, {name: d, strategy: diloco, options: {inner_steps: 4}}]", extra="restarts: 1\ncheckpoint_every: 6\n"),
        "checkpoint_every", "a multiple of inner_steps (4"),
    "checkpoints_without_restarts": (text("[flat-dp]", extra="checkpoint_every: 5\n"), "checkpoint_every",
                                     "set restarts too"),
    "buddy_replay_without_sampling": (
        text("[flat-dp]", extra="faults: [{kind: sdc, rank: 1, at: step 2, target: gradient, bit: 30}]\n"
                                "sdc_replay_by: buddy\n"),
        "sdc_replay_by", "set sdc_replay too"),
    "buddy_replay_in_a_pipeline": (
        text("[flat-dp, {name: p, strategy: pp}]", extra="faults: [{kind: sdc, rank: 1, at: step 2, target: gradient, "
                                                        "bit: 30}]\nsdc_replay: 10%\nsdc_replay_by: buddy\n"),
        "sdc_replay_by", "no buddy can recompute them"),
    "buddy_replay_where_buckets_leave_in_backward": (
        text("[flat-dp, ddp]", extra="faults: [{kind: sdc, rank: 1, at: step 2, target: gradient, bit: 30}]\n"
                                     "sdc_replay: 10%\nsdc_replay_by: buddy\n"),
        "sdc_replay_by", "no buddy can compare a rank's gradient"),
    "sdc_replay_without_sdc": (text("[flat-dp]", extra="sdc_replay: 10%\n"), "sdc_replay", "add an sdc fault"),
    "sdc_replay_beyond_every_step": (text("[flat-dp]", extra="sdc_replay: 150%\n"), "sdc_replay",
                                     "between 0% and 100%"),
    "partition_outlasting_the_cell": (text("[flat-dp]", extra="cell_timeout: 60s\nfaults: [{kind: partition, "
                                                           "between: [east, west], at: 1s, duration: 2min}]\n"),
                                      "faults[0].duration", "as long as cell_timeout"),
    "loss_burst_of_nothing": (text("[flat-dp]", extra="faults: [{kind: loss-burst, between: [east, west], "
                                                      "at: 1s, duration: 1s, loss: 0%}]\n"),
                              "faults[0].loss", "more than 0%"),
    "straggler_that_is_not_slower": (text("[flat-dp]", extra="faults: [{kind: straggler, rank: 0, at: step 1, "
                                                             "duration: 1s, slowdown: 0.5}]\n"),
                                     "faults[0].slowdown", "more than 1"),
}


def write(directory: Path, case: str) -> Path:
    path = directory / f"{case}.yaml"
    path.write_text(MALFORMED[case][0])
    return path
