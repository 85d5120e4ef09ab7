"""Test helper for the SNS sink tests, run with the moto venv's Python (boto3):

    sns_queue.py setup ENDPOINT NAME       -> {"topic_arn": ..., "queue_url": ...}
    sns_queue.py drain ENDPOINT QUEUE_URL COUNT SECONDS
        -> [{"message": <record text>, "attributes": {name: value}}, ...]

`setup` makes a topic and an SQS queue subscribed to it; `drain` reads the queue until COUNT
messages arrived or SECONDS passed, deleting what it read.
"""
import json
import sys
import time

import boto3


def client(service, endpoint):
    return boto3.client(service, endpoint_url=endpoint, region_name="us-east-1",
                        aws_access_key_id="test", aws_secret_access_key="test")


def setup(endpoint, name):
    sns, sqs = client("sns", endpoint), client("sqs", endpoint)
    topic_arn = sns.create_topic(Name=name)["TopicArn"]
    queue_url = sqs.create_queue(QueueName=name + "-q")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sns.subscribe(TopicArn=topic_arn, Protocol="sqs", Endpoint=queue_arn)
    print(json.dumps({"topic_arn": topic_arn, "queue_url": queue_url}))


def drain(endpoint, queue_url, count, seconds):
    sqs = client("sqs", endpoint)
    got, deadline = [], time.time() + seconds
    while len(got) < count and time.time() < deadline:
        answer = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
        for message in answer.get("Messages", []):
            envelope = json.loads(message["Body"])
            attributes = {k: v["Value"] for k, v in envelope.get("MessageAttributes", {}).items()}
            got.append({"message": envelope["Message"], "attributes": attributes})
            sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
    print(json.dumps(got))


if __name__ == "__main__":
    if sys.argv[1] == "setup":
        setup(sys.argv[2], sys.argv[3])
    else:
        drain(sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]))
