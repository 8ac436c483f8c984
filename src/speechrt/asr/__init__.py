"""Speech recognition: audio -> features -> log-probs -> CTC decoding -> timed words.

- pipeline: the ASR recogniser (windows, batching, decoding choice)
- ctc: greedy CTC decoding, word timing and forced alignment
- beam: CTC prefix beam search with a word n-gram LM
- lm: the word n-gram LM the beam search queries (estimation is in the training package)
- wer: word and character error rates
"""

from speechrt.asr.pipeline import ASR

__all__ = ["ASR"]
