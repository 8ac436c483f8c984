"""Training code for speechrt's shipped default models (not part of the runtime package).

Run as `PYTHONPATH=src:train python -m speechrt_train COMMAND` (or `pip install -e train`):
corpus, fastpitch, hifigan, quartznet, export. See docs/models/README.md.
"""
