"""ONNX: the exporter's weight names (one owner), the checked export, fusion, the streaming patcher,
ONNX Runtime sessions (`runtime`) and an export's manifest (`manifest`, export.json)."""
