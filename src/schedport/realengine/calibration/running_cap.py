"""The running-sequence cap (``max_num_seqs``) of a server, observed under a burst of held requests."""

from __future__ import annotations

from schedport.realengine.calibration.limits import Limits
from schedport.realengine.calibration.probes import Plateau, Prober
from schedport.realengine.replay import EndpointError


async def observe_max_num_seqs(lim: Limits, prober: Prober, samples, base: str, log) -> None:
    """The running-sequence cap: the plateau of num_requests_running under 64, 256, 1024 probes."""
    if lim.overrides.get("max_num_seqs") is not None:
        lim.put("max_num_seqs", None, "")
        return
    if samples is None:
        raise EndpointError(f"{base}: no /metrics endpoint to observe the running-sequence cap; "
                            f"give --max-num-seqs")
    n = 64
    while True:
        look = await prober.running_plateau(n, deadline_s=min(20.0, prober.timeout_s))
        log(f"max_num_seqs probe: {look.describe()}; some waiting: {look.waited}")
        warn_left(look, log)
        if not look.waited and look.seen < n:
            # not every probe was seen in the server's queues at once (a busy machine): a
            # plateau below n without a queue is no evidence of a cap; look once more, as long
            # as one probe request may take (--request-timeout), not a fixed wall-clock time: a
            # starved server is slow, not wrong, and the look ends once all n have arrived
            look = await prober.running_plateau(n, deadline_s=prober.timeout_s)
            log(f"max_num_seqs probe again: {look.describe()}; some waiting: {look.waited}")
            warn_left(look, log)
            if not look.waited and look.seen < n:
                raise EndpointError(f"{base}: the running-sequence cap could not be observed in a "
                                    f"look of up to {prober.timeout_s:g} s (--request-timeout): neither "
                                    f"a queue behind the plateau nor all {n} in the server at once; "
                                    f"{look.describe()}; give --max-num-seqs")
        if look.waited or look.best < n:
            lim.put("max_num_seqs", look.best, f"observed plateau of num_requests_running ({n} sent)")
            return
        if n >= 1024:
            lim.put("max_num_seqs", look.best, f"at least {look.best} (all {n} probes ran at once)")
            return
        n *= 4


def warn_left(look: Plateau, log) -> None:
    """Say so when the server still ran cancelled probes after a look (see `Prober._drain`)."""
    if look.left:
        log(f"warning: the server still reports {look.left} requests running or waiting after the "
            f"max_num_seqs probes were cancelled; the next probes may be skewed")
