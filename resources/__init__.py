"""The app's shipped resources: the built-in model (``models/``) and the icons (``icons/``).

Installed from a wheel as the package ``onnx_local_llm_resources`` (setup.py maps it onto
this folder); code finds the folder through ``engine.model.default_model.resources_dir``.
"""
