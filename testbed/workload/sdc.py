"""Silent data corruption, injected and caught, in the data-parallel strategies.

Injection: one bit of one float32 element of a gradient (after backward, before the collective) or a parameter
(after the optimizer step) is flipped on one rank at one step (TESTBED_SDC, a JSON list the harness writes from
the experiment's `faults:`; the element is the one named, else chosen by the fault's seed).

Detection (TESTBED_SDC_CHECK=1), every step:
- gradients, which an all-reduce would spread to every rank unnoticed: each rank checks its own gradient before
  the collective; an anomaly is a gradient that does not sum to its checksums (testbed.workload.gradsums: sums
  taken on the side in backward, which see an exponent flip of all but the smallest elements), a non-finite
  norm, or a norm or largest element above GRAD_FACTOR times the median of this rank's last HISTORY steps
  (for parameters the checksums do not cover). The step's local gradient is then recomputed (a replay: samples
  are a pure function of seed, step and index): the same bits again mean no corruption (`reproduced`: the
  data's own spike) -- unless the checksums found it, which hold for any data: then the rank repeats its own
  defect (`persistent`) --, other bits mean the first was corrupt (`transient` when the replay passes, and its
  gradient is the one reduced: nothing corrupt reached the collective; `persistent` when not). A persistent
  gradient is left out of the step (zeros: the rank's samples count for nothing) rather than spread. With
  TESTBED_SDC_REPLAY = r each rank also replays a share r of its steps unasked (chosen by seed, rank and step),
  which catches flips too small for the norm (mantissa and low exponent bits) on the steps it samples.
  Where gradients leave bucket by bucket during backward (hier-dp-overlap, DDP; FSDP2 parameter by parameter),
  each bucket is checked as it leaves and a corrupt one poisoned, so that all ranks drop the reduction and
  compute the step again (bucket_ready, after_sync).
- parameters, which replicas must hold bit for bit: a digest of every parameter's bytes (CRC-32, so any
  flipped bit changes it) gathered from every rank; the ranks that differ from the
  majority are named, every rank takes the parameters of a rank of the majority (the last good state), and the
  checksums are compared again: transient when they agree, persistent when not. Where no majority can name a
  rank (a rank alone: fsdp's shards, a pipeline stage or a DiLoCo DC of one rank; two replicas, which tie), each
  rank also seals its parameters as the optimizer leaves them (their digest and a copy) and checks the seal
  before their next use: a broken seal is named at its rank, undone from the copy and checked again (Seal).
Events go to the rank's metrics as `sdc_injected` / `sdc_detected` lines."""

from __future__ import annotations

import json
import math
import os
import random
import statistics
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from testbed import rankenv
from testbed.workload.gradsums import GradientChecksums

GRAD_FACTOR = 10.0  # a gradient norm (or largest element) this many times its recent median is an anomaly
HISTORY = 20  # steps of each rank's gradient history the median is taken over


@dataclass(frozen=True)
class Injection:
    rank: int
    step: int
    target: str  # "gradient" | "parameter"
    bit: int
    tensor: str | None = None
    index: int | None = None
    seed: int = 0
    sticky: bool = False  # flipped again in every replay of the step (a deterministic defect of the rank)


def injections_from_env(rank: int) -> list[Injection]:
    """This rank's injections from TESTBED_SDC."""
    items = json.loads(os.environ.get(rankenv.SDC) or "[]")
    return [Injection(**item) for item in items if item["rank"] == rank]


def checking_from_env() -> bool:
    return os.environ.get(rankenv.SDC_CHECK, "0") == "1"


def buddy_from_env() -> bool:
    """TESTBED_SDC_BUDDY=1: sampled steps are replayed by a buddy rank, not by the rank itself."""
    return os.environ.get(rankenv.SDC_BUDDY, "0") == "1"


def replay_rate_from_env() -> float:
    """TESTBED_SDC_REPLAY: the share of steps each rank replays unasked (0 to 1; default 0: on anomalies only)."""
    rate = float(os.environ.get(rankenv.SDC_REPLAY) or 0.0)
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"{rankenv.SDC_REPLAY}: a share of steps between 0 and 1, got {rate}")
    return rate


def flip_bit(tensor: torch.Tensor, index: int, bit: int) -> tuple[float, float]:
    """Flip bit `bit` (0-31) of float32 element `index` of `tensor` in place; (value before, value after)."""
    if tensor.dtype != torch.float32 or not tensor.is_contiguous():
        raise ValueError(f"bit flips are for contiguous float32 tensors, not {tensor.dtype}")
    flat = tensor.detach().view(-1)
    before = float(flat[index])
    mask = torch.tensor((1 << bit) - (1 << 32 if bit == 31 else 0), dtype=torch.int32, device=tensor.device)
    bits = flat.view(torch.int32)
    bits[index] = torch.bitwise_xor(bits[index], mask)
    return before, float(flat[index])


def checksum(tensors: list[torch.Tensor]) -> int:
    """The CRC-32 of the tensors' bytes in order, read in place: it changes with every flipped bit and every burst
    of up to 32 (by construction), and with values changing places; 6x faster than BLAKE2b here (0.23 against
    1.43 ms per MB, measured 2026-11-24), and a digest that tells corruption apart needs no more."""
    crc = 0
    for tensor in tensors:
        crc = zlib.crc32(memoryview(tensor.detach().contiguous().cpu().view(-1).numpy()).cast("B"), crc)
    return crc


def poison(tensor: torch.Tensor) -> None:
    """Set one element of a gradient bucket to NaN: a reduced gradient with it is non-finite on every rank."""
    with torch.no_grad():
        tensor.view(-1)[0] = float("nan")


def odd_ones(values: list[int]) -> tuple[list[int], int | None]:
    """The positions whose value differs from the majority's, and the first position holding the majority's
    value (None on a tie: no majority to trust, every position that differs from another is named)."""
    counts = {value: values.count(value) for value in values}
    best = max(counts.values())
    leaders = [value for value, count in counts.items() if count == best]
    if len(leaders) > 1:
        return [i for i, value in enumerate(values) if len(counts) > 1], None
    good = leaders[0]
    return [i for i, value in enumerate(values) if value != good], values.index(good)


def guard_from_env(rank: int, names: list[str], params: list[torch.Tensor],
                   replicas: Callable[[], tuple[object, list[int]]], seed: int,
                   model: torch.nn.Module | None, gradients_refused: str | None = None,
                   in_buckets: bool = False, can_recompute_for_others: bool = False,
                   samples_together: bool = False) -> Guard | None:
    """This rank's Guard when the harness asked for injections or checks (TESTBED_SDC, TESTBED_SDC_CHECK), else
    None. `replicas()`: the group whose ranks hold the same parameters, and its ranks (asked only when guarding);
    `model`: the modules whose gradients are computed (None: synthetic gradients, no checksums);
    `gradients_refused`: why this strategy's gradients cannot be checked before their collective (gradient flips
    refused); `in_buckets`: gradients are checked bucket by bucket as they leave during backward (bucket_ready),
    where no step can be replayed before its collective: the strategy computes a sampled step's gradient once
    beforehand, without communicating (sample_reference), and each bucket is compared with it as it leaves;
    `can_recompute_for_others`: the strategy can compute another replica's gradient (a buddy replay);
    `samples_together`: computing a sampled step's gradient beforehand takes collectives of its own (FSDP2
    all-gathers the weights for every forward), so every rank samples the same steps."""
    injections, check = injections_from_env(rank), checking_from_env()
    if not injections and not check:
        return None
    if gradients_refused and any(item.target == "gradient" for item in injections):
        raise ValueError(f"sdc: {gradients_refused}: a gradient corruption cannot be checked before its collective "
                         "(target: parameter can)")
    rate, buddy = replay_rate_from_env(), buddy_from_env()
    if in_buckets and buddy:
        raise ValueError("sdc: gradients leave bucket by bucket during backward here: no buddy can compare a "
                         f"rank's gradient before it leaves ({rankenv.SDC_BUDDY})")
    if buddy and (model is None or not can_recompute_for_others):
        raise ValueError("sdc: a buddy replays another rank's gradient from that rank's samples: not with synthetic "
                         f"compute, nor in a pipeline, whose stages' inputs come from other ranks ({rankenv.SDC_BUDDY})")
    sums = GradientChecksums(model) if check and model is not None else None
    group, ranks = replicas()
    return Guard(rank, names, params, group, ranks, injections, check, rate, seed, sums, buddy, samples_together)


@dataclass
class Flagged:
    """A bucket found corrupt in a step's first computation, judged in its replay by its parameters' names (not
    its index: DDP lays its buckets out anew after its first step, so one bucket may come back as several)."""

    detected_by: str
    digests: dict[str, int]  # parameter -> its gradient's digest in the first computation
    pending: set[str]  # parameters not yet seen in the replay
    changed: bool = False  # some gradient came back with other bits
    again: bool = False  # some bucket holding its gradients was flagged again in the replay

    def verdict(self) -> str:
        """reproduced: the same bits, flagged by the norm (the data's own spike); persistent: flagged again, or the
        same bits that the checksums, which hold for any data, denied; transient: other bits, which pass."""
        if not self.changed:
            return "reproduced" if self.detected_by != "grad-checksum" else "persistent"
        return "persistent" if self.again else "transient"


class Guard:
    """Injects this rank's corruptions and runs the checks, for a strategy whose replicas are identical over
    `group` (ranks `group_ranks`)."""

    def __init__(self, rank: int, names: list[str], params: list[torch.nn.Parameter], group: object,
                 group_ranks: list[int], injections: list[Injection], check: bool, replay_rate: float = 0.0,
                 seed: int = 0, sums: GradientChecksums | None = None, buddy: bool = False,
                 together: bool = False) -> None:
        """`sums`: the model's gradient checksums, when its gradients are computed (not synthetic); `buddy`:
        sampled steps are replayed by buddies (before_collective's recompute_for); `together`: every rank samples
        the same steps (as with buddies)."""
        self.rank, self.names, self.params, self.sums, self.buddy = rank, names, params, sums, buddy
        self.replay_rate, self.seed, self.together = replay_rate, seed, together or buddy
        self.group, self.group_ranks = group, group_ranks
        self.injections, self.check = injections, check
        self.norms: list[float] = []
        self.peaks: list[float] = []
        self.bucket_norms: dict[int, list[float]] = {}  # each bucket's own history (buckets checked one by one)
        self.bucket_peaks: dict[int, list[float]] = {}
        self._flagged: list[Flagged] = []  # buckets flagged in this computation of the step
        self._replaying: list[Flagged] | None = None  # the first computation's, in its replay
        self._reference: dict[str, int] | None = None  # a sampled step's gradients computed beforehand: digests
        self.events: list[dict] = []
        self.check_s = 0.0
        self._left_out = False  # this step's gradient was zeroed as persistently corrupt

    def take(self) -> tuple[list[dict], float]:
        """Events since the last call, and the seconds the checks took (the detection cost, the checksums'
        share of backward included)."""
        events, seconds = self.events, self.check_s
        if self.sums is not None:
            seconds += self.sums.seconds
            self.sums.seconds = 0.0
        self.events, self.check_s = [], 0.0
        return events, seconds

    def gradients_zeroed(self) -> None:
        """The step's (or its replay's) backward starts afresh: so do the checksums."""
        if self.sums is not None:
            self.sums.reset()

    # --- injection ------------------------------------------------------------------------------------------
    def _inject(self, step: int, target: str, tensors: dict[str, torch.Tensor] | None = None,
                again: bool = False) -> None:
        """Flip the bits due at `step` in `target`: in the parameters' gradients or data, or in `tensors` (a
        bucket's gradients by parameter name: those due in another bucket wait for theirs). `again`: a replay of
        the step (or a restore) is done: only sticky flips come back, and are not reported twice."""
        for item in self.injections:
            if item.step != step or item.target != target or (again and not item.sticky):
                continue
            rng = random.Random(item.seed)
            name = item.tensor or rng.choice(self.names)
            if name not in self.names:
                raise ValueError(f"sdc: no parameter named {name!r} (parameters: {', '.join(self.names)})")
            param = self.params[self.names.index(name)]
            if tensors is not None and name not in tensors:
                continue
            tensor = tensors[name] if tensors is not None else param.grad if target == "gradient" else param.data
            index = item.index if item.index is not None else rng.randrange(tensor.numel())
            if index >= tensor.numel():
                raise ValueError(f"sdc: {name} has {tensor.numel()} elements, no index {index}")
            with torch.no_grad():
                before, after = flip_bit(tensor, index, item.bit)
            if again:
                continue
            self.events.append({"event": "sdc_injected", "rank": self.rank, "step": step, "target": target,
                                "tensor": name, "index": index, "bit": item.bit, "before": before, "after": after})

    # --- gradients ------------------------------------------------------------------------------------------
    @staticmethod
    def _norm_anomaly(tensors: list[torch.Tensor], norms: list[float], peaks: list[float]) -> tuple[bool, float, float]:
        """Whether `tensors` are non-finite, or their norm or largest element above GRAD_FACTOR times the median of
        their history (`norms`, `peaks`); their norm and largest element."""
        norm = float(torch.nn.utils.get_total_norm(tensors, 2.0))  # fused over the tensors (torch's foreach norms)
        peak = float(torch.nn.utils.get_total_norm(tensors, float("inf")))
        bad = not (math.isfinite(norm) and math.isfinite(peak))
        if not bad and norms:
            bad = norm > GRAD_FACTOR * statistics.median(norms) or peak > GRAD_FACTOR * statistics.median(peaks)
        return bad, norm, peak

    def _gradient_anomaly(self) -> tuple[str | None, float, float]:
        """What found this rank's gradient anomalous ("grad-checksum", "grad-norm"; None: nothing), its norm and
        largest element."""
        bad, norm, peak = self._norm_anomaly([param.grad.detach() for param in self.params], self.norms, self.peaks)
        if self.sums is not None and self.sums.mismatches():
            return "grad-checksum", norm, peak
        return ("grad-norm" if bad else None), norm, peak

    def _grad_digest(self) -> int:
        return checksum([param.grad for param in self.params])

    def _sampled(self, step: int) -> bool:
        """Whether step `step` is replayed unasked: a pure function of seed, rank and step (of seed and step when
        the ranks sample together: every replica takes part in the same steps' exchanges)."""
        key = f"{self.seed}/{step}" if self.together else f"{self.seed}/{self.rank}/{step}"
        return self.replay_rate > 0 and random.Random(key).random() < self.replay_rate

    def before_collective(self, step: int, replay: Callable[[], float | None],
                          recompute_for: Callable[[int], None] | None = None) -> float | None:
        """Inject a gradient corruption due now; check this rank's gradient, replaying the step's local compute on
        an anomaly or when the step is sampled. Returns the replay's loss when the step was replayed, else None.

        A replay that gives the same bits as the first computation means no corruption (an anomaly is then the
        data's own spike: `reproduced`), but for a checksum mismatch (no data gives one: `persistent`); different
        bits mean the first was corrupt: `transient` when the replay passes (a second replay agrees with it, when
        sampled), `persistent` when it does not. A persistent gradient is zeroed: left out of the collective."""
        self._inject(step, "gradient")
        if not self.check:
            return None
        self._left_out = False
        loss = self._self_check(step, replay)
        if self.buddy and self._sampled(step):
            assert recompute_for is not None, "a buddy replay needs the strategy's recompute_for"
            loss = self._buddy_check(step, replay, recompute_for, loss)
        return loss

    def _self_check(self, step: int, replay: Callable[[], float | None]) -> float | None:
        """before_collective's check on this rank alone; the replay's loss when one ran."""
        start = time.perf_counter()
        bad, norm, peak = self._gradient_anomaly()
        sampled = not bad and not self.buddy and self._sampled(step)
        first = self._grad_digest() if bad or sampled else None
        self.check_s += time.perf_counter() - start
        if first is None:
            self.norms, self.peaks = [*self.norms, norm][-HISTORY:], [*self.peaks, peak][-HISTORY:]
            return None
        loss = self._replayed(step, replay)  # recovery as much as detection: its time is in the step, not check_s
        start = time.perf_counter()
        again, norm, peak = self._gradient_anomaly()
        second = self._grad_digest()
        self.check_s += time.perf_counter() - start
        if second == first:  # the same bits: the data's own spike, unless its checksums say no data gives them
            classification = ("persistent" if bad == "grad-checksum" else "reproduced") if bad else None
        elif bad:
            classification = "persistent" if again else "transient"
        else:  # a sampled replay disagreed with a gradient that looked normal: which of the two is right?
            loss = self._replayed(step, replay)
            classification = "transient" if self._grad_digest() == second else "persistent"
        if classification is not None:
            self.events.append({"event": "sdc_detected", "rank": self.rank, "step": step, "target": "gradient",
                                "detected_by": bad or "replay-sample", "suspect_rank": self.rank,
                                "classification": classification})
        if classification == "persistent":
            self._leave_out()
        else:
            self.norms, self.peaks = [*self.norms, norm][-HISTORY:], [*self.peaks, peak][-HISTORY:]
        return loss

    def _leave_out(self) -> None:
        """This rank's gradient is known corrupt and cannot be made right: zeroed, its samples count for nothing
        (the collective's average is not spread with it)."""
        with torch.no_grad():
            for param in self.params:
                param.grad.zero_()
        self._left_out = True

    def _others_gradient(self, rank: int, recompute_for: Callable[[int], None]) -> int:
        """The digest of rank `rank`'s local gradient of this step computed here; this rank's own is kept."""
        kept = [param.grad.clone() for param in self.params]
        recompute_for(rank)
        digest = self._grad_digest()
        with torch.no_grad():
            for param, grad in zip(self.params, kept):
                param.grad.copy_(grad)
        return digest

    def _exchange(self, values: list[int]) -> list[list[int]]:
        mine = torch.tensor(values, dtype=torch.int64)
        out = [torch.zeros(len(values), dtype=torch.int64) for _ in self.group_ranks]
        dist.all_gather(out, mine, group=self.group)
        return [[int(v) for v in row] for row in out]

    def _buddy_check(self, step: int, replay: Callable[[], float | None], recompute_for: Callable[[int], None],
                     loss: float | None) -> float | None:
        """A sampled step replayed by buddies: every replica recomputes its predecessor's gradient (from that
        rank's samples, on its own hardware) and the digests are exchanged (one all-gather). Where a rank's and its
        buddy's disagree, the rank replays itself and the rank after its buddy recomputes it too (a second
        all-gather): the rank's replay agreeing with its buddy -> its first computation was corrupt (`transient`,
        the replay goes on); its replay repeating its first while the second buddy sides with the first ->
        a defect of the rank's own (`persistent`, left out), which a replay on the rank itself cannot see; the
        second buddy siding with the rank -> the buddy's recomputation was corrupt (`transient`, on the buddy).
        Decided alike on every rank from the same exchanges; each verdict is written by the rank it names."""
        n, me = len(self.group_ranks), self.group_ranks.index(self.rank)
        if n < 2:
            return loss
        start = time.perf_counter()
        first = -1 if self._left_out else self._grad_digest()  # -1: already judged
        checked = self._others_gradient(self.group_ranks[(me - 1) % n], recompute_for)
        rows = self._exchange([first, checked])
        disputed = [j for j in range(n) if rows[j][0] != -1 and rows[(j + 1) % n][1] != rows[j][0]]
        if disputed:
            mine = -1
            if me in disputed:
                loss = self._replayed(step, replay)
                mine = self._grad_digest()
            seconds = [self._others_gradient(self.group_ranks[j], recompute_for)
                       if n > 2 and (j + 2) % n == me else -1 for j in range(n)]
            rows2 = self._exchange([mine, *seconds])
            for j in disputed:
                f, c1, r = rows[j][0], rows[(j + 1) % n][1], rows2[j][0]
                c2 = rows2[(j + 2) % n][1 + j] if n > 2 else None
                named, verdict = self.group_ranks[j], "unresolved (two replicas)"
                if r == c1:
                    verdict = "transient"
                elif r == f and c2 == c1:
                    verdict = "persistent"
                elif r == f and c2 == f:
                    named, verdict = self.group_ranks[(j + 1) % n], "transient"  # the buddy's recomputation
                elif r != f:
                    verdict = "persistent"  # three different gradients from the rank: it cannot repeat itself
                if named == self.rank:
                    self.events.append({"event": "sdc_detected", "rank": self.rank, "step": step,
                                        "target": "gradient", "detected_by": "buddy-replay",
                                        "suspect_rank": self.rank, "classification": verdict})
                if j == me and verdict == "persistent" and named == self.rank:
                    self._leave_out()
        self.check_s += time.perf_counter() - start
        return loss

    def _replayed(self, step: int, replay: Callable[[], float | None]) -> float | None:
        """The step's local compute done again (a defect of this rank's own, a sticky flip, comes back)."""
        loss = replay()
        self._inject(step, "gradient", again=True)
        return loss

    # --- gradients that leave during backward ----------------------------------------------------------------
    # (hier-dp-overlap's buckets, DDP's, FSDP2's parameters): each bucket is checked as it becomes final, before it leaves; a bucket
    # found corrupt is poisoned (one element set to NaN), so that every rank finds the reduced gradient
    # non-finite after the collective -- as a loss scaler finds an overflow -- and all drop it and compute the
    # step again together: the corrupt value went out, but no rank applies it, and no extra collective is needed
    # to agree. A replay that gives the same bits again is the data's own (`reproduced`: not poisoned again),
    # unless the checksums flagged them (`persistent`); other bits that pass are `transient`; other bits flagged
    # again are `persistent`, and the step is skipped.
    def samples(self, step: int) -> bool:
        """Whether step `step` is sampled for a replay where gradients leave during backward: its gradient is
        computed once beforehand, without communicating, and given to sample_reference."""
        return self.check and self._sampled(step)

    def sample_reference(self, step: int, grads: dict[str, torch.Tensor]) -> None:
        """The sampled step's gradients (by parameter name) computed beforehand: each bucket of the step's own
        computation (and of its replay) must match them bit for bit (`replay-sample`), which also sees flips too
        small for the checksums. A rank's own defect (a sticky flip) comes back here too, as in any replay."""
        self._inject(step, "gradient", grads, again=True)
        start = time.perf_counter()
        self._reference = {name: checksum([grad]) for name, grad in grads.items()}
        self.check_s += time.perf_counter() - start

    def bucket_ready(self, step: int, bucket: int, grads: dict[str, torch.Tensor]) -> bool:
        """Bucket `bucket`'s gradients (by parameter name) are final and about to leave: inject a gradient
        corruption due in them now (in the step's replay only a sticky one) and check them. True: poison the
        bucket."""
        replaying = self._replaying is not None
        self._inject(step, "gradient", grads, again=replaying)
        if not self.check:
            return False
        start = time.perf_counter()
        bad = "grad-checksum" if self.sums is not None and self.sums.mismatches(grads) else None
        # the norm only for what no checksum covers: a bucket's own norm swings with its few tensors (measured:
        # 20 alarms in 60 clean steps of the tiny GPT in 0.25 MB buckets, each a replay by every rank)
        unchecked = [grad for name, grad in grads.items() if self.sums is None or name not in self.sums.covered]
        norms, peaks = self.bucket_norms.setdefault(bucket, []), self.bucket_peaks.setdefault(bucket, [])
        norm = peak = None
        if bad is None and unchecked:
            found, norm, peak = self._norm_anomaly(unchecked, norms, peaks)
            bad = "grad-norm" if found else None
        if bad is None and self._reference is not None:
            reference = self._reference
            if any(checksum([grad]) != reference[name] for name, grad in grads.items() if name in reference):
                bad = "replay-sample"
        poison = False
        touched = [flag for flag in self._replaying or [] if flag.pending & grads.keys()]
        if not replaying:
            if bad:
                digests = {name: checksum([grad]) for name, grad in grads.items()}
                self._flagged.append(Flagged(bad, digests, set(digests)))
                poison = True
        elif touched:
            reproduced = True  # every flagged gradient here came back bit for bit, flagged by the norm alone
            for flag in touched:
                names = flag.pending & grads.keys()
                flag.changed |= any(checksum([grads[name]]) != flag.digests[name] for name in names)
                flag.again |= bad is not None
                flag.pending -= names
                reproduced &= flag.verdict() == "reproduced"
                if not flag.pending:
                    self._judged(step, flag)
            poison = bad is not None and not reproduced
        elif bad:  # clean in the first computation, corrupt in the replay: the step is dropped
            self.events.append({"event": "sdc_detected", "rank": self.rank, "step": step, "target": "gradient",
                                "detected_by": bad, "suspect_rank": self.rank, "classification": "in the replay"})
            poison = True
        if not bad and norm is not None:
            norms.append(norm)
            peaks.append(peak)
            del norms[:-HISTORY], peaks[:-HISTORY]
        self.check_s += time.perf_counter() - start
        return poison

    def after_sync(self, step: int, reduced: Callable[[], list[torch.Tensor]],
                   replay: Callable[[], float | None]) -> tuple[bool, float | None]:
        """After the collectives of buckets checked by bucket_ready: whether to apply the reduced gradient, and
        the loss of a replay (None: none ran). A poisoned bucket comes back non-finite on every rank (its whole
        reduction, or each rank's shard of it: FSDP2's are poisoned whole), so all decide alike: non-finite -> all
        compute the step again; non-finite again -> all skip it."""
        if not self.check:
            return True, None
        try:
            return self._after_sync(step, reduced, replay)
        finally:
            self._reference = None

    def _after_sync(self, step: int, reduced: Callable[[], list[torch.Tensor]],
                    replay: Callable[[], float | None]) -> tuple[bool, float | None]:
        loss = None
        for attempt in range(2):
            start = time.perf_counter()
            finite = math.isfinite(float(torch.nn.utils.get_total_norm(reduced(), 2.0)))
            self.check_s += time.perf_counter() - start
            if finite or attempt == 1:
                break
            self._replaying, self._flagged = self._flagged, []
            loss = replay()  # recomputing is recovery as much as detection: its time is in the step
        if self._replaying is not None:  # every rank says so: a step computed twice costs them all
            for flag in self._replaying:
                if flag.pending:  # gradients the replay did not bring back (none expected): judged on the rest
                    self._judged(step, flag)
            self.events.append({"event": "sdc_replayed", "rank": self.rank, "step": step, "applied": finite})
        self._replaying, self._flagged = None, []
        return finite, loss

    def _judged(self, step: int, flag: Flagged) -> None:
        flag.pending = set()
        self.events.append({"event": "sdc_detected", "rank": self.rank, "step": step, "target": "gradient",
                            "detected_by": flag.detected_by, "suspect_rank": self.rank,
                            "classification": flag.verdict()})

    # --- parameters -----------------------------------------------------------------------------------------
    def _gather(self, mine: int) -> list[int]:
        values = [torch.zeros(1, dtype=torch.int64) for _ in self.group_ranks]
        dist.all_gather(values, torch.tensor([mine], dtype=torch.int64), group=self.group)
        return [int(v) for v in values]

    def after_update(self, step: int) -> None:
        """Inject a parameter corruption due now and check the parameters: a rank with fewer than two others
        holding the same parameters checks its own seal first; then every replica's checksum is compared (where
        there are replicas) and the odd ones are restored from the majority."""
        start = time.perf_counter()
        seal = Seal.of(self.params) if self.check and len(self.group_ranks) < 3 else None
        self.check_s += time.perf_counter() - start
        self._inject(step, "parameter")
        if not self.check:
            return
        start = time.perf_counter()
        mine = checksum(self.params)
        if seal is not None and mine != seal.digest:
            mine = self._broken_seal(step, seal)
        if len(self.group_ranks) >= 2:
            self._compare_replicas(step, mine)
        self.check_s += time.perf_counter() - start

    def _broken_seal(self, step: int, seal: Seal) -> int:
        """This rank's parameters changed after the update sealed them: name it, put the sealed values back, and
        judge by the seal again (a cell that keeps flipping flips the restored value); the checksum now."""
        seal.restore(self.params)
        self._inject(step, "parameter", again=True)
        now = checksum(self.params)
        self.events.append({"event": "sdc_detected", "rank": self.rank, "step": step, "target": "parameter",
                            "detected_by": "param-seal", "suspect_rank": self.rank,
                            "classification": "transient" if now == seal.digest else "persistent"})
        return now

    def _compare_replicas(self, step: int, mine: int) -> None:
        odd, good = odd_ones(self._gather(mine))
        if not odd:
            return
        classification = "unresolved (no majority)"
        if good is not None:
            with torch.no_grad():
                for param in self.params:
                    dist.broadcast(param.data, self.group_ranks[good], group=self.group)
            self._inject(step, "parameter", again=True)  # a cell that keeps flipping flips the restored value
            classification = "transient" if not odd_ones(self._gather(checksum(self.params)))[0] else "persistent"
        if self.rank == self.group_ranks[0]:  # one record per detection, written by the group's first rank
            for position in odd:
                self.events.append({"event": "sdc_detected", "rank": self.group_ranks[position], "step": step,
                                    "target": "parameter", "detected_by": "param-checksum",
                                    "suspect_rank": self.group_ranks[position], "classification": classification})


@dataclass
class Seal:
    """A rank's parameters as the optimizer left them: their checksum and a copy. Where no majority of replicas
    can name the rank that differs (a rank alone: fsdp's shards, a pipeline stage or a DiLoCo DC of one rank; or
    two replicas, which tie), each rank seals its own after the update and checks the seal before their next use:
    a flip in between (in the memory that holds them, which is what `target: parameter` injects) is caught at its
    rank and undone from the copy. A wrong update itself breaks no seal: only replicas, where there are any,
    catch that."""

    digest: int
    copy: list[torch.Tensor]

    @classmethod
    def of(cls, params: list[torch.Tensor]) -> Seal:
        with torch.no_grad():
            return cls(checksum(params), [param.detach().clone() for param in params])

    def restore(self, params: list[torch.Tensor]) -> None:
        with torch.no_grad():
            for param, kept in zip(params, self.copy, strict=True):
                param.copy_(kept)
