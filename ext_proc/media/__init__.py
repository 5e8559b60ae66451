"""Media: the parts of a body that carry images, audio or files, and masking images by OCR."""
