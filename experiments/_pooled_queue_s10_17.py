"""The capacity ramps' queue pooled over the profiles of issue #20's sets 10–17 (not an
experiment itself): set 18's candidate ``s18-pooled-queue`` reads one hop's and a topology's
queue bound from it (``TailOptions.ramp_pooled``) instead of the profile's own single 2 s runs.
Made by ``experiments/tail_pooled_queue.py --print-table`` over the eight kept profiles
(artifacts/tail20-s10 … s17, ``prof-setN.db``), 2026-11-28 01:58–02:03 UTC: at each load fraction
of the closed loop and each of ``SKETCH_PROBS``, the median of the eight profiles' queues in
requests' worth (``ramp_queue.pooled_queue``); rounded to 4 decimals. Frozen before set 18, held
there and since then the model's own table (``ramp_queue.POOLED_QUEUE``, the same numbers): the
variant keeps its name so that its scoring reads as registered."""

from meshtax.predict.ramp_queue import POOLED_QUEUE

POOLED_QUEUE_S10_17 = POOLED_QUEUE
