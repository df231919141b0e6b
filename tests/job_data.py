"""Inputs of the three built-in job types and valid provider answers for them, shared by the
job-type, provider-limit, pricing, privacy and tenant-isolation tests. The scripted answers differ
from the synthetic provider's, so a test can tell which provider answered.
"""

from __future__ import annotations

from typing import Any

# The longest job type name the registry accepts (64 characters).
LONGEST = "t" + "_long_name" * 6 + "_ab"

SOURCE = (
    "Photosynthesis converts light energy into chemical energy. It takes place in the "
    "chloroplasts of plant cells. Chlorophyll absorbs mostly blue and red light.\n"
    "Oxygen is released as a by-product of splitting water."
)
ANSWERS = [
    {
        "question": "Where does photosynthesis take place?",
        "givenAnswer": "mitochondria",
        "correctAnswer": "chloroplasts",
        "isCorrect": False,
        "topic": "cell biology",
    },
    {
        "question": "Which gas is released by photosynthesis?",
        "givenAnswer": "oxygen",
        "correctAnswer": "oxygen",
        "isCorrect": True,
        "topic": "photosynthesis",
    },
    {
        "question": "What does the cell membrane do?",
        "givenAnswer": "",
        "correctAnswer": "controls what enters and leaves the cell",
        "isCorrect": False,
        "topic": "cell biology",
    },
]
INPUTS: dict[str, dict[str, Any]] = {
    "quiz_generation": {"sourceText": SOURCE, "count": 3, "difficulty": "hard"},
    "flashcard_generation": {"sourceText": SOURCE, "count": 2},
    "weak_point_analysis": {"answers": ANSWERS},
}
# What the fake provider answers with: valid outputs that differ from the synthetic ones.
SCRIPTED: dict[str, dict[str, Any]] = {
    "quiz_generation": {
        "questions": [
            {
                "question": "Where in plant cells does photosynthesis take place?",
                "choices": ["Nucleus", "Chloroplasts", "Mitochondria", "Ribosomes"],
                "answer_index": 1,
                "explanation": "The text says it takes place in the chloroplasts.",
            },
            {
                "question": "Which colours of light does chlorophyll mostly absorb?",
                "choices": ["Green", "Yellow and orange", "Blue and red", "Infrared"],
                "answer_index": 2,
                "explanation": "Chlorophyll absorbs mostly blue and red light.",
            },
        ]
    },
    "flashcard_generation": {
        "flashcards": [
            {"front": "What does photosynthesis convert?", "back": "Light into chemical energy."},
            {"front": "Where does it take place?", "back": "In the chloroplasts."},
            {"front": "What is released?", "back": "Oxygen, from splitting water."},
        ]
    },
    "weak_point_analysis": {
        "weak_points": [
            {
                "topic": "Cell structures",
                "evidence": ["#1: answered 'mitochondria', correct 'chloroplasts'"],
                "recommended_action": "Review the organelles and their functions.",
            },
            {
                "topic": "Membranes",
                "evidence": ["#3: no answer, correct 'controls what enters and leaves'"],
                "recommended_action": "Re-read the section on the cell membrane.",
            },
        ]
    },
}
