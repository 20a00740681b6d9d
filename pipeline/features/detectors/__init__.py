"""The bottom-up detector: Anderson et al.'s Visual Genome Faster R-CNN (ResNet C4 + attributes).

``caffe_resnet``  the trunk and res5 as the Caffe model has them
``anchors``       the RPN's anchors (Caffe's generate_anchors)
``boxes``         Caffe's box coding, clipping and NMS (the "+1" pixel convention)
``rpn``           proposals: objectness, deltas, NMS
``heads``         RoI pooling, res5, the object and attribute predictors
``detector``      the whole network, its settings, and regions for a batch of images
``rules``         whose test-time rules it follows: Caffe's generate_tsv.py (default) or MMF's
``regions``       the regions an image keeps, labelled (extract-regions --arch bottom-up)
``checkpoints``   the checkpoint namings it loads (MILVLG bua-caffe, airsplay/LXMERT/mmf, capstack)
``training``      training it on a dataset's boxes (the demo's detector)
"""
