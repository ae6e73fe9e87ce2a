"""SwitchML for Python: all-reduce through an in-network aggregation switch.

    import numpy as np, switchml
    ctx = switchml.Context(rank=r, num_workers=n, switch_host="10.0.0.1", session_id=7)
    out = ctx.allreduce(np.ones(1000, np.float32))     # a new array with the sum
    ctx.allreduce(grad, out=grad)                      # in place
    h = ctx.allreduce_async(grad, out=grad); ...; h.wait()

`import switchml.torch` registers the "switchml" torch.distributed backend. See docs/python.md.
"""

from switchml._core import TRANSPORTS, Config, Context, Handle, Switch, SwitchMLError

__all__ = ["Config", "Context", "Handle", "Switch", "SwitchMLError", "TRANSPORTS"]
