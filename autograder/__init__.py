"""The course's autograder: ``grade.py`` (the instructor's command) and the nbgrader pipeline it runs.

``repair`` re-attaches lost nbgrader metadata, ``execute`` runs notebooks in a ``sandbox`` under ``limits`` and
decides each graded cell by its ``checks`` (in the grader's process), ``feedback`` keeps hidden tests out of
feedback, and
``redteam`` holds the submissions that try to cheat it. ``nbgrader_config.py`` is the course's nbgrader
configuration.
"""
