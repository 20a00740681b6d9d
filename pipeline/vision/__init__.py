"""Images and backbones that extraction, the detectors and the demo share.

``images``     decoding any image file to RGB (a bad file is a reason, never a crash), the
               DataLoader dataset and batches, the grid and detector transforms
``backbones``  torchvision ResNets (and the demo's resnet10), their weights from files, the
               conv trunk up to a stage

It imports only :mod:`pipeline.core`: ``features/extract``, ``features/detectors`` and
``demo`` import it, never the reverse.
"""
