"""UPOS tagging on top of the encoders: the tagger, its training, the pipeline file and the evaluation.

`evaluate` scores predictions: accuracy with sentence-level bootstrap intervals, paired comparisons,
a most-frequent-tag baseline, and the scores/comparisons tables of the results contract.
"""
