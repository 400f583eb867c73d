"""Imported first by the benchmark's forkserver (`zoo.bench.matrix._context`'s preload).

Ctrl-C reaches the whole process group, the forkserver included. multiprocessing's
forkserver ignores SIGINT only once its preload is imported, and importing torch takes it
a second or two: a Ctrl-C then printed a KeyboardInterrupt traceback from inside torch's
import among the user's output. From here on it ignores SIGINT; each worker forked from it
puts back the handler the forkserver started with (`INHERITED`: Python's, or SIG_IGN where
`zoo bench` itself ignores SIGINT, as under nohup or `&` in a script) before anything else
(`zoo.bench.measure.run_in_child`), so Ctrl-C interrupts a worker's export and
measurement where it interrupts `zoo bench`, and only there.
"""

import signal

#: the SIGINT handler this process started with
INHERITED = signal.getsignal(signal.SIGINT)
signal.signal(signal.SIGINT, signal.SIG_IGN)
