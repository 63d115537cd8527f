"""The shift detector: when did a stage's time change, where, by how much — said in one sentence.

"queue time tripled at 10:05 on replica r2 (p50 60 → 185 ms); prefill and decode unchanged;
arrivals on r2 up 45%"

Method, per scope (all traffic, each replica / service / model) and per stage:

1. Candidate change times are window boundaries (the findings' ``at`` is the start of the first
   window after the change).
2. For every candidate at once, a Mann-Whitney U statistic of the requests before vs after it,
   from one cumulative sum of ranks (the rank-CUSUM; O(n log n) for all splits). The split with
   the largest |z| is a change point; each side is searched again (binary segmentation), so a
   burst that ends is found with its end. When the end brings the stage back (within
   ``min_factor``, or within ``min_abs_ms``: 0.3 → 115 → 0.7 ms came back), the burst is one
   finding from its onset, with ``until``; an end that stops part way is a change of its own,
   never ranked above the onset it undoes. A burst's edges are then placed from its requests
   (the boundary with the fewest of them on the wrong side of it), since the segmentation's
   floor of ``min_side`` requests a side, and the rank test's taste for even splits, would put
   them where the stage had not moved yet. Values are ranked to the millisecond. The log's
   first window alone (or the first ``min_side`` requests of a scope) is no baseline: a change
   from there, or a "burst" from there until the real onset, would frame the healthy part of the
   log as the incident; the burst's end is then the change. A step whose first ``min_side``
   requests hold a significant return to its level before (a host's hiccup, then a flood: neither
   stretch long enough to be split off) starts after that return.
3. It is reported only when it is significant after a Bonferroni correction for every scope ×
   stage × candidate tested, has at least ``min_side`` requests on each side, and is large for a
   user: the p50 (or, for stages that are mostly zero such as ``connect``, the p90) moved by
   ``min_factor`` or more and by ``min_abs_ms`` or more.
4. The narrowest scope wins: when some replicas (services, models) moved and the others, seen on
   both sides of the change, did not, the finding names those; else the scope is ``{}``. When
   two attributes each explain it so (a service whose network rose on both replicas, and the
   replica whose requests are mostly that service's: its p50 moved, the other's did not), the
   one that holds the other's change is named, as in step 5 (the other's requests outside it did
   not move; the service's requests on the other replica did), the more significant when each
   holds the other or neither does. A
   single-attribute scope is then refined by the same rule along one more attribute with at most
   ``MAX_CELL_VALUES`` values: when exactly one cell of it moved (replica r2 × model m1) and the
   other cells of r2 did not, the finding names both (``{"replica": "r2", "model": "m1"}``).
   Only a hit is refined, and only along attributes with few values, so the search stays bounded.
   A change found in all traffic only is confined to the one value of an attribute that moved at
   its time while the others did not (a rank test at that one split, ``CONFINE_MIN_SIDE``
   requests a side): a short run's service is too small to be searched on its own.
5. Detections of one stage in several scopes within a few windows are one change. A change
   whose onset shows at moments further apart from different scopes (a queue building up: 15 s,
   ``onset_spread_s``, or the few windows if longer) is said once too: a shift is dropped when
   another one of the same stage and direction holds it (the residual, its requests outside that
   one's scope, did not move), the scope with fewer requests staying when each holds the other; a
   correlated scope (a replica most of a region's traffic goes to) whose onset shows later, while
   the holding change lasts, is held all the same. Each second is counted in one finding.
6. One incident per onset: the shifts of one scope that start within ``onset_windows`` are said
   from the one that explains the users' time (the largest; a client's pool wait is a
   consequence of any stage its connections are held for that rose with it), the others "with
   it"; ``impact_s`` is the sum (stages add up). A change's users' time is what its requests
   spent beyond their baseline, quantile by quantile (``stats.excess_s``): each request after it
   minus the value at the same quantile of the segment before it, summed; a tail-only change
   counts in full, a skewed stage's doubling counts its mean's rise. A ``connect`` shift names the part that moved:
   the client's pool wait or new connections (TCP + TLS), since their cures differ.
7. What moved with it: other stages' p50, arrival rate, concurrency, prompt length and cache hits,
   before vs after, in the same scope; the load over the interval each side names (``span_s``:
   the log's start to the change, the change to its end), so a rate never exceeds the log's. A ratio within ``PERCENT_RANGE`` is said as a percentage,
   any other change (from a near-zero baseline) as its two values; a headline factor beyond
   ``SPOKEN_FACTOR`` likewise.

Findings are ordered by the users' time they cost (``impact_s``), the onset first on a tie.
The statistic is rank-based, so a few very slow requests cannot fake a shift, and skewed clocks
cannot either (stages never mix hosts' clocks). ``tests/analyzer/test_shifts.py`` measures the
false-positive rate on stationary logs with seeds the thresholds were not tuned on.

Modules: ``stats`` (steps 1-3: the rank test, segmentation, a burst's edges), ``scopes`` (4-5:
the narrowest scope, one cell, one change said once), ``incidents`` (6), ``context`` and
``words`` (7, and the sentence), ``detector`` (the run, and the registered ``StageShifts``).
"""
