"""Imported first by the benchmark's forkserver (`zoo.bench.matrix._context`'s preload).

Ctrl-C reaches the whole process group, the forkserver included. multiprocessing's
forkserver ignores SIGINT only once its preload is imported, and importing torch takes it
a second or two: a Ctrl-C then printed a KeyboardInterrupt traceback from inside torch's
import among the user's output. From here on it ignores SIGINT; each worker forked from it
puts Python's handler back before anything else (`zoo.bench.measure.run_in_child`), so
Ctrl-C still interrupts a worker's export and measurement.
"""

import signal

signal.signal(signal.SIGINT, signal.SIG_IGN)
