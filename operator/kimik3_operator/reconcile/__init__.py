"""The only package that imports kopf: handlers, the reconcile pass, status computation."""
