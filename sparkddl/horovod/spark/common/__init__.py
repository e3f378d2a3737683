"""Horovod's ``horovod.spark.common`` names that sparkddl accepts (the Store classes)."""
