"""What torchft's replica groups did in a cell (every DC one group: testbed.workload.replica), from the ranks'
metrics: how many groups, the fewest in a step's quorum, the steps the others took without a group, each restarted
group's heal (from its start again to the end of the step the heal ended in, and the state that crossed the links
for it) and the survivors' pace before, while and after a group was down."""

from __future__ import annotations

import itertools
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

from testbed.model.heal import FetchPrediction, HealPrediction, predict_fetch, predict_heal
from testbed.model.network import Network, build_network
from testbed.model.transport import Transport
from testbed.runner.lighthouse import JOIN_TIMEOUT_MS, heartbeat_timeout_ms
from testbed.spec.link import LinkParams
from testbed.spec.topology import Topology
from testbed.steplog import read_records


def _pace(times: list[float]) -> float | None:
    """Steps per second over the step ends in `times` (None with fewer than two)."""
    return (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else None


def replica_figures(metrics_dir: Path, world: int, outages: list[tuple[float, float | None]],
                    dc_names: list[str] | None = None) -> dict[str, Any]:
    """`outages`: (killed or cut off at, started again or joined again at or None) of each DC's kill and each
    partition applied, epoch seconds. Figures of the ranks whose files are in `metrics_dir`: replica_groups,
    participants_min and degraded_steps (steps with fewer groups in the quorum than there are groups) from each
    rank's first quorum of all groups on, startup_steps (a survivor's steps before it), heals (per restarted rank:
    heal_s from its start again to the end of the step its heal ended in, first_step_s, its setup_s, the state's
    fetch_s and where from, healed_bytes) and steps_per_s before the first outage, while a group was out and after
    the last rejoin, longest_gap_s (between two step ends after the outage), slowest_step_before_s and
    median_step_s, on the first rank never killed; and whether the replicas ended equal (params_agree, from each
    rank's final digest; groups_apart: the groups without the parameters most groups ended with), each group's
    fewest groups in a quorum (participants_min_by_group), the steps a group took after every other had ended
    (steps_after_others_ended) and group_names, each group named by its DC (`dc_names`, else its index)."""
    files = {rank: read_records(metrics_dir / f"rank{rank}.jsonl") for rank in range(world)
             if (metrics_dir / f"rank{rank}.jsonl").exists()}
    groups = {r["replica_group"] for records in files.values() for r in records
              if r.get("event") == "start" and r.get("replica_group") is not None}
    steps = {rank: [r for r in records if r.get("event") == "step"] for rank, records in files.items()}
    # each rank's steps from its first quorum of every group on: before it, groups that started later had not
    # joined yet (the lighthouse forms a quorum of whoever is there: min_replicas 1)
    joined = {rank: next((i for i, r in enumerate(records) if r.get("participants") == len(groups)), len(records))
              for rank, records in steps.items()}
    participants = [r["participants"] for rank, records in steps.items() for r in records[joined[rank]:]
                    if r.get("participants")]  # 0: no quorum yet (a DiLoCo's inner steps before its first outer one)
    heals = []
    for rank, records in sorted(files.items()):
        starts = [i for i, r in enumerate(records) if r.get("event") == "start"]
        for begin in starts[1:]:
            started = records[begin]["time"]
            after = [r for r in records[begin:] if r.get("event") == "step"]
            # each step says what its process has healed so far: the heal ended inside the first step that says
            # some (torchft-ddp: the first step; DiLoCo: the step whose outer sync took the group's first quorum)
            healed = next((r for r in after if r.get("healed_bytes", 0) > 0), None)
            killed = max((at for at, _ in outages if at <= started), default=None)
            index = records[begin].get("replica_group")
            group = None if index is None else _group_name(index, dc_names or [])
            heals.append({"rank": rank, "group": group, "restarted_at": started, "killed_at": killed,
                          "heal_s": healed["time"] - started if healed else None,
                          "first_step_s": after[0]["time"] - started if after else None,
                          "setup_s": records[begin].get("setup_s"),
                          "healed_at_step": healed["step"] if healed else None,
                          "fetch_s": healed.get("heal_fetch_s") if healed else None,  # the state's GET alone
                          "healed_from": healed.get("healed_from") if healed else None,  # the healthy group's node
                          "healed_bytes": max((r.get("healed_bytes", 0) for r in after), default=0),
                          **_heal_parts(started, records[begin].get("setup_s"), healed,
                                        after[:after.index(healed) + 1] if healed else [])})
    restarted = {heal["rank"] for heal in heals}
    survivor = next((rank for rank in sorted(steps) if rank not in restarted and steps[rank]), None)
    out: dict[str, Any] = {"replica_groups": len(groups), "participants_min": min(participants, default=None),
                           "heals": heals, **_agreement(files, joined, dc_names or [])}
    if survivor is not None:
        own = steps[survivor]
        out["startup_steps"] = joined[survivor]  # steps it took before every group had joined
        out["degraded_steps"] = sum(1 for r in own[joined[survivor]:] if r.get("participants", len(groups)) < len(groups))
        out["survivor_rank"] = survivor
        if outages:
            first = min(at for at, _ in outages)
            back = [again for _, again in outages]
            last = max(back) if all(again is not None for again in back) else None
            rejoined = [r["time"] for r in own if last is not None and r["time"] > last
                        and r.get("participants") == len(groups)]
            ends = [r["time"] for r in own]
            out["steps_per_s"] = {
                "before": _pace([t for t in ends if t <= first]),
                "down": _pace([t for t in ends if first < t <= (rejoined[0] if rejoined else ends[-1])]),
                "after": _pace([t for t in ends if rejoined and t >= rejoined[0]])}
            gaps = [b["time"] - a["time"] for a, b in itertools.pairwise(own) if b["time"] > first]
            # the slowest step it took with every group in, before the kill (in a DiLoCo: one with an outer sync)
            out["slowest_step_before_s"] = max((r["wall_s"] for r in own[joined[survivor]:] if r["time"] <= first),
                                               default=None)
            out["longest_gap_s"] = max(gaps, default=None)
            out["median_step_s"] = statistics.median(r["wall_s"] for r in own) if own else None
        out.update(_quorum_pace(own[joined[survivor]:]))
    return out


def _heal_parts(started: float, setup_s: float | None, healed: dict | None, steps: list[dict]) -> dict[str, float | None]:
    """A heal_s in its parts, from the restarted rank's own clock: its setup, its steps before it first asked the
    lighthouse for a quorum (before_quorum_s), the wait from that ask to the fetch's start less the new quorum's
    process group's building (quorum_wait_s; reconfigure_s, summed over `steps`, its steps to the heal's), the fetch
    (fetch_s, beside) and the rest of the step (rest_s)."""
    asked = healed.get("quorum_first_asked_at") if healed else None
    fetched = healed.get("heal_fetch_at") if healed else None
    if healed is None or setup_s is None or asked is None or fetched is None:
        return {"before_quorum_s": None, "quorum_wait_s": None, "reconfigure_s": None, "rest_s": None}
    reconfigure = sum(r.get("pg_configure_s") or 0.0 for r in steps)
    return {"before_quorum_s": asked - started - setup_s, "quorum_wait_s": fetched - asked - reconfigure,
            "reconfigure_s": reconfigure, "rest_s": healed["time"] - fetched - healed.get("heal_fetch_s", 0.0)}


def _quorum_pace(own: list[dict]) -> dict[str, float | None]:
    """A survivor's pace from every group's first quorum on: its median step that took a quorum's commit (the
    Manager's step advanced: every step under torchft-ddp, an outer sync under a DiLoCo; sync_step_s), the median of
    the others (inner_step_s; None under torchft-ddp), the median time between two such steps (quorum_period_s) and
    its median building of a new quorum's process group (reconfigure_s: at the kill, at the rejoin)."""
    synced = [b for a, b in itertools.pairwise(own) if b.get("manager_step", 0) > a.get("manager_step", 0)]
    inner = [r["wall_s"] for a, r in itertools.pairwise(own) if r.get("manager_step", 0) == a.get("manager_step", 0)]
    ends = [r["time"] for r in synced]
    built = [r["pg_configure_s"] for r in own if r.get("pg_configure_s")]
    return {"reconfigure_s": statistics.median(built) if built else None,
            "sync_step_s": statistics.median(r["wall_s"] for r in synced) if synced else None,
            "inner_step_s": statistics.median(inner) if inner else None,
            "quorum_period_s": statistics.median(b - a for a, b in itertools.pairwise(ends)) if len(ends) > 1 else None}


def _group_name(index: int, dc_names: list[str]) -> str:
    """A replica group's name: its DC's, else its index."""
    return dc_names[index] if index < len(dc_names) else str(index)


def _agreement(files: dict[int, list[dict]], joined: dict[int, int], dc_names: list[str]) -> dict[str, Any]:
    """Whether every group ended with the same parameters (each rank's `end` digest; None while a rank has none)
    and which groups did not end with those most ranks hold, and each group's fewest groups in a quorum after its
    first quorum of all."""
    indices = {rank: next((r["replica_group"] for r in records if r.get("event") == "start"
                           and r.get("replica_group") is not None), None) for rank, records in files.items()}
    known = sorted({i for i in indices.values() if i is not None})
    names = [_group_name(i, dc_names) for i in range(known[-1] + 1)] if known else []
    group_of = {rank: None if i is None else names[i] for rank, i in indices.items()}
    last = {rank: next((r for r in reversed(records) if r.get("event") == "end"), None) for rank, records in files.items()}
    ends = {rank: end["params_sha256"] if end else None for rank, end in last.items()}
    counts = Counter(d for d in ends.values() if d).most_common(2)
    agree = None if not ends or None in ends.values() else len(set(ends.values())) == 1
    # no digest most ranks hold (a tie): every group is apart
    held = counts[0][0] if counts and (len(counts) == 1 or counts[0][1] > counts[1][1]) else None
    apart = sorted({group for rank, digest in ends.items() if digest and digest != held
                    and (group := group_of[rank]) is not None})
    fewest: dict[str, int] = {}
    for rank, records in files.items():
        seen = [p for p in [r["participants"] for r in records if r.get("event") == "step"][joined.get(rank, 0):] if p]
        if seen and (group := group_of[rank]) is not None:
            fewest[group] = min(fewest.get(group, min(seen)), min(seen))
    # the steps each group took after every other group had ended (a group back from a partition once the
    # others were done trains its last steps alone: a quorum of one is granted where it alone heartbeats)
    ended: dict[str, float] = {}
    for rank, end in last.items():
        if end is not None and (group := group_of[rank]) is not None:
            ended[group] = max(ended.get(group, end["time"]), end["time"])
    after: dict[str, int] = {}
    for rank, records in files.items():
        group = group_of[rank]
        others = [t for g, t in ended.items() if g != group]
        if group is not None and others:
            count = sum(1 for r in records if r.get("event") == "step" and r["time"] > max(others))
            after[group] = max(after.get(group, 0), count)
    return {"params_agree": agree, "groups_apart": apart, "participants_min_by_group": fewest,
            "steps_after_others_ended": {g: n for g, n in after.items() if n}, "group_names": names}


def predict_heals(figures: dict[str, Any], topology: Topology, links: dict[str, LinkParams],
                  dc_of_address: dict[str, str], dc_of_rank: list[str], transport: Transport,
                  calibrated: bool, options: dict[str, Any]) -> None:
    """Beside each heal that fetched a state, testbed.model.heal's prediction of that fetch (`fetch_predicted_s`,
    and its parts) from the state's size and the path from the healthy group's DC to the healed one's, with the
    cell's links (`fetch_transport` says whether the transport's fitted constants or its first guesses were used);
    and of the whole heal (`heal_predicted_s`, its parts and the range its quorum wait spans) from that fetch, the
    lighthouse's timeouts, the strategy's steps before a quorum, and what the machine measured: the survivors' pace and
    their building of a quorum's process group, the heal's setup_s (`options`: the cell's workload options)."""
    network = build_network(topology, links)
    names = [dc.name for dc in topology.dcs]
    for heal in figures.get("heals", []):
        source = dc_of_address.get(heal.get("healed_from") or "")
        if source is None or not heal.get("healed_bytes") or heal["rank"] >= len(dc_of_rank):
            continue
        src, dst = names.index(source), names.index(dc_of_rank[heal["rank"]])
        if src == dst:
            continue
        there, back = network.path(src, dst), network.path(dst, src)
        assert there is not None and back is not None
        fetch = predict_fetch(heal["healed_bytes"], there.latency, back.latency, there.bandwidth, transport)
        heal.update({"healed_from_dc": source, "fetch_predicted_s": fetch.total_s,
                     "fetch_predicted": {"handshake_s": fetch.handshake_s, "transfer_s": fetch.transfer_s,
                                         "copies_s": fetch.copies_s},
                     "fetch_transport": "calibrated" if calibrated else "first guesses"})
        whole = _predict_whole(heal, fetch, figures, network, dst, options)
        if whole is not None:
            heal.update({"heal_predicted_s": whole.total_s, "heal_predicted": {
                "setup_s": whole.setup_s, "before_quorum_s": whole.before_quorum_s, "quorum_wait_s": whole.quorum_wait_s,
                "reconfigure_s": whole.reconfigure_s, "fetch_s": whole.fetch_s, "rest_s": whole.rest_s,
                "quorum_wait_range_s": [whole.wait_low_s, whole.wait_high_s], "survivors_waiting": whole.survivors_waiting}})


def _predict_whole(heal: dict[str, Any], fetch: FetchPrediction, figures: dict[str, Any], network: Network, dc: int,
                   options: dict[str, Any]) -> HealPrediction | None:
    """testbed.model.heal.predict_heal for one heal (None where a figure it needs is missing: no survivor's pace,
    no setup_s or kill time)."""
    sync, period = figures.get("sync_step_s"), figures.get("quorum_period_s")
    if heal.get("setup_s") is None or heal.get("killed_at") is None or sync is None or period is None:
        return None
    strategy = options.get("strategy", "")
    if strategy == "torchft-ddp":  # the quorum is asked for at the step's start, the step follows the heal
        before, rest = 0.0, sync
    else:  # a DiLoCo asks in the hook of a sync's inner step, less the fragment's delay
        inner = figures.get("inner_step_s") or 0.0
        fragments = int(options.get("fragments") or 1) if strategy == "torchft-streaming-diloco" else 1
        delay = int(options.get("fragment_sync_delay") or 0) if strategy == "torchft-streaming-diloco" else 0
        before = (int(options.get("inner_steps") or 1) // fragments - delay) * inner
        rest = max(0.0, sync - inner) if delay == 0 else 0.0  # with a delay its all-reduce is waited steps later
    there, back = network.path(dc, 0), network.path(0, dc)  # the lighthouse: the first DC's first node
    rtt = (there.latency + back.latency) if dc != 0 and there is not None and back is not None else 0.0
    asked = heal["restarted_at"] + heal["setup_s"] + before - heal["killed_at"]
    return predict_heal(fetch, setup_s=heal["setup_s"], before_quorum_s=before, quorum_period_s=period, rest_s=rest,
                        reconfigure_s=figures.get("reconfigure_s") or 0.0,
                        asked_after_kill_s=asked,
                        heartbeat_timeout_s=heartbeat_timeout_ms(options) / 1000,
                        join_timeout_s=JOIN_TIMEOUT_MS / 1000, lighthouse_rtt_s=rtt)
