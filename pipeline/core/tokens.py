"""The four special tokens and their ids, below both the caption files and the decoders.

``<pad>`` = 0 pads label rows, ``<bos>`` = 1 starts decoding, ``<eos>`` = 2 ends a
caption, ``<unk>`` = 3 stands for every word the vocabulary does not keep. The
vocabulary (``pipeline/captions/vocab.py``) puts them first; decoders, decoding
and the data loader use the ids without reaching into the caption files' module.
"""

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIALS = (PAD, BOS, EOS, UNK)
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(4)
