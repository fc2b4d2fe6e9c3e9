"""What the operator's layers and its stager agree on, in one dependency-free place.

Standard library only, and nothing else of the project: the API validation, the planner, the
renderer, the API client and the stager (which runs in a Job from the same image but may not
import the operator) all read the same names, formats and registries from here, so no two of
them can disagree.
"""
