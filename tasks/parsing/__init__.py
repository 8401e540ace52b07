"""The parse stage's format parsers, by concern; tasks/parse.py is the entry point that dispatches to them.

common (options, logic version, cleaning) and limits (hostile-input guards) are the base; text, markup,
office, layout, ocr and pdf build on them (office on markup, ocr on layout, pdf on layout and ocr). No module
here imports tasks.parse, SQL or Prefect; heavy libraries (PyMuPDF, unstructured, the OCR engine) are
imported inside the functions that need them.
"""
