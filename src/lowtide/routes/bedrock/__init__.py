"""AWS Bedrock: `bedrock-batch`, Bedrock's batch inference (model invocation jobs, S3 in and out)
on boto3 and s3fs, and what its batch takes of a request (wire.py).
"""
