"""The study's data: treebanks (`conllu`, `synthetic`), documents (`doc`) and the text selection (`texts`).

Light on purpose (no imports): the commands' parsers and the Snakefile read SPLITS from here.
"""

SPLITS = ("train", "dev", "test")  # a treebank's own splits, in order: train trains, dev selects
