"""What bench.py and its --ddp mode do with the files they wrote."""
import os
import shutil


def publish(files, docs_dir, log):
    """Copies files into docs_dir (when given) and logs what was written where."""
    if docs_dir:
        os.makedirs(docs_dir, exist_ok=True)
        for f in files:
            shutil.copy(f, docs_dir)
    log("wrote " + ", ".join(files) + (f" (copied to {docs_dir})" if docs_dir else ""))
