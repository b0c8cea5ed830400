"""The masker moved to `dynrunner.proto.masking` (the controller's failure reports use it too,
and the controller does not carry the executor); this name stays for code still importing it."""

from dynrunner.proto.masking import MASK, Masker, forms_of, secret_forms

__all__ = ["MASK", "Masker", "forms_of", "secret_forms"]
