"""The procedurally drawn "shapes" dataset, capstack's stand-in for MS-COCO.

Images of 1-4 coloured objects on a light background, five COCO-like captions
each and every object's box, written in the Karpathy format of
``dataset_coco.json`` so that the demo runs the code COCO runs.

Modules, one idea each:

- ``scene``     what an image shows (objects, background) and how it is sampled
- ``outlines``  the geometry of each shape
- ``relations`` spatial relations and positions computed from the geometry
- ``draw``      a scene -> an RGB picture and tight object boxes
- ``lexicon``   the caption words and their skewed odds (the long tail)
- ``grammar``   articles, plurals, lists
- ``captions``  five varied, true captions per scene (the default, ``--captions grammar``)
- ``free_lexicon``, ``free_captions``  five freer ones (``--captions free``): more sentence
  frames, word orders and synonyms, drawn from their own generator (same images)
- ``chance``    fast weighted choices from one generator
- ``writer``    ``write_shapes_dataset``: images + Karpathy json, atomically
"""

from .writer import write_shapes_dataset

__all__ = ["write_shapes_dataset"]
