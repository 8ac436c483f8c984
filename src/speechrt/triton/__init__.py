"""Triton Inference Server: a model repository built from speechrt's contracts.

config.py    config.pbtxt text from a contract (no torch, no onnx)
writer.py    `speechrt export --triton-repo`: graphs, python models, ensembles
backend.py   the python-backend models (text front end, ASR features, CTC) Triton runs
"""
