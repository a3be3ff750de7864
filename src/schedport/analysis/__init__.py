"""Analysis: from a results store to `portability.json`.

Rank portability (`portability`), the paired study form and its claims (`studyform`), why a
ranking flips (`explain`), and the statistics of a validation against a real engine
(`validation_stats`). Reads the study's store; never renders HTML.
"""

