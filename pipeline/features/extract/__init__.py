"""Feature extraction: images -> ResNet grid features and Faster R-CNN region features."""
