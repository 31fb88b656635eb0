"""The grader's Jupyter kernel: ipykernel, with ``gpulab.ddp``'s fork server forked from it as it starts.

    python -m gpulab.kernel -f CONNECTION_FILE      # where a kernelspec says: python -m ipykernel_launcher -f ...

Lessons 02-04 launch DDP (``gpulab.ddp.launch``), whose ranks are forked from multiprocessing's fork server. That
server otherwise starts, at the first launch, as a new interpreter that imports torch, ``torch._dynamo`` and
gpulab: about 4 s of CPU for each kernel, for imports the kernel makes as well. This kernel makes them first
(every lesson imports torch and makes an optimizer, which imports ``torch._dynamo``), forks the server from
itself while it is still one thread (``gpulab.ddp.start_fork_server_here``), then runs ipykernel exactly as
``python -m ipykernel_launcher`` does. The ranks are what a launch makes either way: forks of a server that
imported the same modules and touched no GPU. The grader starts its kernels so (``autograder/execute.py``); a
learner's JupyterLab starts ipykernel itself, and the first launch starts the server.
"""

from __future__ import annotations

import runpy
import traceback


def main() -> None:
    try:
        from gpulab import ddp

        ddp.start_fork_server_here()
    except Exception:  # noqa: BLE001 - the kernel starts whatever happened: a launch then starts its own server
        traceback.print_exc()
    runpy.run_module("ipykernel_launcher", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
