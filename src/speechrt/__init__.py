"""speechrt: inference runtime and server for neural speech models."""

from speechrt.errors import SpeechRTError

__version__ = "0.1.0"
__all__ = ["SpeechRTError", "__version__"]
