"""Real S3 clients against Tidemark's gateway, driven by crates/tidemark/tests/s3_gateway.rs.

    python3 clients.py boto3  ENDPOINT ACCESS_KEY SECRET_KEY
    python3 clients.py access ENDPOINT ADMIN_AK ADMIN_SK READER_AK READER_SK
    python3 clients.py owners ENDPOINT ONE_AK ONE_SK TWO_AK TWO_SK
    python3 clients.py policies ENDPOINT ONE_AK ONE_SK TWO_AK TWO_SK
    python3 clients.py errors ENDPOINT ACCESS_KEY SECRET_KEY
    python3 clients.py tools  ENDPOINT ACCESS_KEY SECRET_KEY WORKDIR
    python3 clients.py sse    ENDPOINT ACCESS_KEY SECRET_KEY WORKDIR DATA_DIR KMS_KEY_ID NO_KEYRING_ENDPOINT

Each mode exits non-zero with the failed check on stderr.
"""

import base64
import re
import hashlib
import http.client
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import zlib

import boto3
import botocore
import botocore.auth
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import ClientError


def client(endpoint, ak, sk, **cfg):
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=ak,
        aws_secret_access_key=sk,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}, **cfg),
    )


def code_of(fn):
    try:
        fn()
    except ClientError as e:
        return e.response["Error"]["Code"]
    return None


def expect_code(want, fn, what):
    got = code_of(fn)
    assert got == want, f"{what}: expected {want}, got {got}"


TRICKY = [
    "with space.txt",
    "plus+sign.txt",
    "percent%20literal.txt",
    "unicodé/日本語.txt",
    "equals=and&amp.txt",
    "deep/a/b/c/d/e/f/g/h.txt",
    "tilde~and'quote.txt",
]


def boto3_mode(endpoint, ak, sk):
    s3 = client(endpoint, ak, sk)
    b = "gw-boto3"
    s3.create_bucket(Bucket=b)
    expect_code("BucketAlreadyOwnedByYou", lambda: s3.create_bucket(Bucket=b), "create twice")
    expect_code("InvalidBucketName", lambda: s3.create_bucket(Bucket="Bad_Name"), "bad bucket name")
    assert b in [x["Name"] for x in s3.list_buckets()["Buckets"]]
    s3.head_bucket(Bucket=b)
    expect_code("404", lambda: s3.head_bucket(Bucket="no-such-bucket"), "head a missing bucket")
    expect_code("NoSuchBucket", lambda: s3.put_object(Bucket="no-such-bucket", Key="k", Body=b"x"), "put into nothing")

    # Put / get / head with metadata, content type, and the MD5 ETag.
    body = b"hello, gateway\n"
    r = s3.put_object(Bucket=b, Key="hello.txt", Body=body, ContentType="text/plain",
                      Metadata={"Owner": "me", "x": "1"})
    md5 = hashlib.md5(body).hexdigest()
    assert r["ETag"] == f'"{md5}"', r["ETag"]
    h = s3.head_object(Bucket=b, Key="hello.txt")
    assert h["ContentLength"] == len(body) and h["ContentType"] == "text/plain", h
    assert h["Metadata"] == {"owner": "me", "x": "1"}, h["Metadata"]
    g = s3.get_object(Bucket=b, Key="hello.txt")
    assert g["Body"].read() == body and g["ETag"] == f'"{md5}"'
    expect_code("NoSuchKey", lambda: s3.get_object(Bucket=b, Key="missing"), "get a missing key")
    expect_code("404", lambda: s3.head_object(Bucket=b, Key="missing"), "head a missing key")

    # Ranges and conditionals.
    assert s3.get_object(Bucket=b, Key="hello.txt", Range="bytes=0-4")["Body"].read() == b"hello"
    assert s3.get_object(Bucket=b, Key="hello.txt", Range="bytes=-6")["Body"].read() == b"teway\n"
    r = s3.get_object(Bucket=b, Key="hello.txt", Range="bytes=7-")
    assert r["Body"].read() == body[7:] and r["ContentRange"] == f"bytes 7-{len(body)-1}/{len(body)}", r["ContentRange"]
    expect_code("InvalidRange", lambda: s3.get_object(Bucket=b, Key="hello.txt", Range=f"bytes={len(body)}-"), "range past the end")
    expect_code("304", lambda: s3.get_object(Bucket=b, Key="hello.txt", IfNoneMatch=f'"{md5}"'), "if-none-match")
    # A 304 carries the validators a cache keeps using its copy with.
    resp = raw_response(endpoint, signed(endpoint, ak, sk, "GET", f"/{b}/hello.txt", b"", {"If-None-Match": f'"{md5}"'}))
    assert resp.status == 304 and resp.getheader("ETag") == f'"{md5}"' and resp.getheader("Last-Modified"), (resp.status, resp.getheaders())
    expect_code("PreconditionFailed", lambda: s3.get_object(Bucket=b, Key="hello.txt", IfMatch='"nope"'), "if-match")
    s3.get_object(Bucket=b, Key="hello.txt", IfMatch=f'"{md5}"')
    past = h["LastModified"].replace(year=2000)
    future = h["LastModified"].replace(year=2100)
    expect_code("304", lambda: s3.get_object(Bucket=b, Key="hello.txt", IfModifiedSince=future), "if-modified-since")
    s3.get_object(Bucket=b, Key="hello.txt", IfModifiedSince=past)
    expect_code("PreconditionFailed", lambda: s3.get_object(Bucket=b, Key="hello.txt", IfUnmodifiedSince=past), "if-unmodified-since")
    r = s3.get_object(Bucket=b, Key="hello.txt", ResponseContentType="application/x-test",
                      ResponseContentDisposition="attachment")
    assert r["ContentType"] == "application/x-test" and r["ContentDisposition"] == "attachment", r

    # Create-only puts.
    expect_code("PreconditionFailed", lambda: s3.put_object(Bucket=b, Key="hello.txt", Body=b"x", IfNoneMatch="*"), "create-only over an object")
    s3.put_object(Bucket=b, Key="fresh.txt", Body=b"new", IfNoneMatch="*")

    # Content-MD5: the right one is accepted, a wrong one refused and nothing written.
    good = base64.b64encode(hashlib.md5(b"checked").digest()).decode()
    s3.put_object(Bucket=b, Key="md5.txt", Body=b"checked", ContentMD5=good)
    bad = base64.b64encode(hashlib.md5(b"other").digest()).decode()
    expect_code("BadDigest", lambda: s3.put_object(Bucket=b, Key="md5.txt", Body=b"tampered", ContentMD5=bad), "bad Content-MD5")
    assert s3.get_object(Bucket=b, Key="md5.txt")["Body"].read() == b"checked", "a refused put changed nothing"

    # Tricky keys round-trip, and list in byte order (also url-encoded).
    for k in TRICKY:
        s3.put_object(Bucket=b, Key=k, Body=k.encode())
    for k in TRICKY:
        assert s3.get_object(Bucket=b, Key=k)["Body"].read() == k.encode(), k
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=b)["Contents"]]
    assert keys == sorted(keys, key=lambda k: k.encode()), keys
    assert set(TRICKY) <= set(keys), keys
    enc = s3.list_objects_v2(Bucket=b, EncodingType="url", Prefix="unicod")
    # Asked for explicitly, botocore leaves the encoding in place (it decodes only what it asked for).
    assert [o["Key"] for o in enc["Contents"]] == [urllib.parse.quote("unicodé/日本語.txt")], enc["Contents"]
    expect_code("InvalidArgument", lambda: s3.put_object(Bucket=b, Key="a/../b", Body=b"x"), "a dot-dot key")
    expect_code("InvalidArgument", lambda: s3.put_object(Bucket=b, Key="a//b", Body=b"x"), "an empty segment")
    expect_code("KeyTooLongError", lambda: s3.put_object(Bucket=b, Key="x" * 300, Body=b"x"), "a too-long name")

    # Listing: prefixes, delimiters, pagination, start-after; ListObjects v1 with markers.
    lb = "gw-list"
    s3.create_bucket(Bucket=lb)
    names = ["a.txt", "b-c.txt", "b/1", "b/2", "b/x/3", "b0", "c/d/e", "d"]
    for k in names:
        s3.put_object(Bucket=lb, Key=k, Body=b".")
    r = s3.list_objects_v2(Bucket=lb, Delimiter="/")
    assert [o["Key"] for o in r["Contents"]] == ["a.txt", "b-c.txt", "b0", "d"], r
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["b/", "c/"], r
    r = s3.list_objects_v2(Bucket=lb, Prefix="b/", Delimiter="/")
    assert [o["Key"] for o in r["Contents"]] == ["b/1", "b/2"] and [p["Prefix"] for p in r["CommonPrefixes"]] == ["b/x/"], r
    r = s3.list_objects_v2(Bucket=lb, Prefix="b")
    assert [o["Key"] for o in r["Contents"]] == ["b-c.txt", "b/1", "b/2", "b/x/3", "b0"], r
    r = s3.list_objects_v2(Bucket=lb, Delimiter="-")
    assert [p["Prefix"] for p in r.get("CommonPrefixes", [])] == ["b-"], r
    seen, token = [], None
    while True:
        kw = {"ContinuationToken": token} if token else {}
        r = s3.list_objects_v2(Bucket=lb, MaxKeys=3, **kw)
        seen += [o["Key"] for o in r.get("Contents", [])]
        if not r["IsTruncated"]:
            break
        token = r["NextContinuationToken"]
    assert seen == sorted(names, key=str.encode), seen
    seen, token = [], None
    while True:
        kw = {"ContinuationToken": token} if token else {}
        r = s3.list_objects_v2(Bucket=lb, MaxKeys=2, Delimiter="/", **kw)
        seen += [o["Key"] for o in r.get("Contents", [])] + [p["Prefix"] for p in r.get("CommonPrefixes", [])]
        if not r["IsTruncated"]:
            break
        token = r["NextContinuationToken"]
    assert sorted(seen) == ["a.txt", "b-c.txt", "b/", "b0", "c/", "d"], seen
    r = s3.list_objects_v2(Bucket=lb, StartAfter="b/2")
    assert [o["Key"] for o in r["Contents"]] == ["b/x/3", "b0", "c/d/e", "d"], r
    pages = list(s3.get_paginator("list_objects").paginate(Bucket=lb, PaginationConfig={"PageSize": 3}))
    assert [o["Key"] for p in pages for o in p.get("Contents", [])] == sorted(names, key=str.encode), pages

    # Copy, with metadata kept or replaced; a copy onto itself without REPLACE is refused.
    s3.copy_object(Bucket=lb, Key="copied", CopySource={"Bucket": b, "Key": "hello.txt"})
    c = s3.head_object(Bucket=lb, Key="copied")
    assert c["Metadata"] == {"owner": "me", "x": "1"} and c["ContentType"] == "text/plain", c
    s3.copy_object(Bucket=lb, Key="copied", CopySource={"Bucket": lb, "Key": "copied"},
                   MetadataDirective="REPLACE", Metadata={"new": "yes"}, ContentType="text/x-new")
    c = s3.head_object(Bucket=lb, Key="copied")
    assert c["Metadata"] == {"new": "yes"} and c["ContentType"] == "text/x-new", c
    assert s3.get_object(Bucket=lb, Key="copied")["Body"].read() == body
    expect_code("InvalidRequest", lambda: s3.copy_object(Bucket=lb, Key="copied", CopySource={"Bucket": lb, "Key": "copied"}), "copy onto itself")
    expect_code("NoSuchKey", lambda: s3.copy_object(Bucket=lb, Key="x", CopySource={"Bucket": lb, "Key": "missing"}), "copy a missing source")

    # An object put whole is one part.
    assert s3.get_object(Bucket=lb, Key="copied", PartNumber=1)["Body"].read() == body
    expect_code("InvalidPart", lambda: s3.get_object(Bucket=lb, Key="copied", PartNumber=2), "part 2 of a whole object")

    # Tags: on PUT (x-amz-tagging), read back in key order, counted on GET and HEAD, replaced,
    # copied (or replaced) with a copy, removed; S3's limits refused; a bucket's own tags.
    s3.put_object(Bucket=lb, Key="tagged", Body=b"t", Tagging="z=1&a=two%20words")
    want = [{"Key": "a", "Value": "two words"}, {"Key": "z", "Value": "1"}]
    assert s3.get_object_tagging(Bucket=lb, Key="tagged")["TagSet"] == want
    assert s3.get_object(Bucket=lb, Key="tagged")["TagCount"] == 2
    h = s3.head_object(Bucket=lb, Key="tagged")["ResponseMetadata"]["HTTPHeaders"]
    assert h.get("x-amz-tagging-count") == "2", h
    s3.copy_object(Bucket=lb, Key="tagged-copy", CopySource={"Bucket": lb, "Key": "tagged"})
    assert s3.get_object_tagging(Bucket=lb, Key="tagged-copy")["TagSet"] == want
    s3.copy_object(Bucket=lb, Key="tagged-copy", CopySource={"Bucket": lb, "Key": "tagged"},
                   TaggingDirective="REPLACE", Tagging="only=this")
    assert s3.get_object_tagging(Bucket=lb, Key="tagged-copy")["TagSet"] == [{"Key": "only", "Value": "this"}]
    s3.put_object_tagging(Bucket=lb, Key="tagged", Tagging={"TagSet": [{"Key": "k", "Value": "v"}]})
    assert s3.get_object_tagging(Bucket=lb, Key="tagged")["TagSet"] == [{"Key": "k", "Value": "v"}]
    too_many = {"TagSet": [{"Key": f"k{i}", "Value": "v"} for i in range(11)]}
    expect_code("InvalidTag", lambda: s3.put_object_tagging(Bucket=lb, Key="tagged", Tagging=too_many), "11 tags")
    expect_code("InvalidTag", lambda: s3.put_object_tagging(Bucket=lb, Key="tagged", Tagging={"TagSet": [{"Key": "k" * 129, "Value": "v"}]}), "a long key")
    assert s3.get_object(Bucket=lb, Key="tagged")["Body"].read() == b"t"
    s3.delete_object_tagging(Bucket=lb, Key="tagged")
    assert s3.get_object_tagging(Bucket=lb, Key="tagged")["TagSet"] == []
    assert "TagCount" not in s3.get_object(Bucket=lb, Key="tagged")
    expect_code("NoSuchTagSet", lambda: s3.get_bucket_tagging(Bucket=lb), "an untagged bucket")
    s3.put_bucket_tagging(Bucket=lb, Tagging={"TagSet": [{"Key": "team", "Value": "data"}]})
    assert s3.get_bucket_tagging(Bucket=lb)["TagSet"] == [{"Key": "team", "Value": "data"}]
    s3.delete_bucket_tagging(Bucket=lb)
    expect_code("NoSuchTagSet", lambda: s3.get_bucket_tagging(Bucket=lb), "tags deleted")
    for k in ("tagged", "tagged-copy"):
        s3.delete_object(Bucket=lb, Key=k)

    # Delete one, delete many; deleting the last key below a prefix removes the prefix too.
    s3.delete_object(Bucket=lb, Key="c/d/e")
    s3.delete_object(Bucket=lb, Key="never-existed")
    r = s3.list_objects_v2(Bucket=lb, Delimiter="/")
    assert "c/" not in [p["Prefix"] for p in r.get("CommonPrefixes", [])], r
    r = s3.delete_objects(Bucket=lb, Delete={"Objects": [{"Key": "b/1"}, {"Key": "b/2"}, {"Key": "b/x/3"}, {"Key": "nope"}]})
    assert sorted(d["Key"] for d in r["Deleted"]) == ["b/1", "b/2", "b/x/3", "nope"] and not r.get("Errors"), r
    expect_code("BucketNotEmpty", lambda: s3.delete_bucket(Bucket=lb), "delete a non-empty bucket")
    for o in s3.list_objects_v2(Bucket=lb)["Contents"]:
        s3.delete_object(Bucket=lb, Key=o["Key"])
    s3.delete_bucket(Bucket=lb)
    expect_code("404", lambda: s3.head_bucket(Bucket=lb), "a deleted bucket")

    # Multipart: parts staged, listed, completed atomically; aborted leaves nothing.
    mb = "gw-multipart"
    s3.create_bucket(Bucket=mb)
    part1 = os.urandom(5 * 1024 * 1024)
    part2 = os.urandom(1234)
    up = s3.create_multipart_upload(Bucket=mb, Key="big/file.bin", ContentType="application/x-big", Metadata={"m": "v"})
    uid = up["UploadId"]
    e2 = s3.upload_part(Bucket=mb, Key="big/file.bin", UploadId=uid, PartNumber=2, Body=part2)["ETag"]
    e1 = s3.upload_part(Bucket=mb, Key="big/file.bin", UploadId=uid, PartNumber=1, Body=part1)["ETag"]
    assert e1 == f'"{hashlib.md5(part1).hexdigest()}"', e1
    parts = s3.list_parts(Bucket=mb, Key="big/file.bin", UploadId=uid)["Parts"]
    assert [(p["PartNumber"], p["Size"]) for p in parts] == [(1, len(part1)), (2, len(part2))], parts
    ups = s3.list_multipart_uploads(Bucket=mb)["Uploads"]
    assert [(u["Key"], u["UploadId"]) for u in ups] == [("big/file.bin", uid)], ups
    expect_code("404", lambda: s3.head_object(Bucket=mb, Key="big/file.bin"), "nothing visible before Complete")
    expect_code("InvalidPart", lambda: s3.complete_multipart_upload(Bucket=mb, Key="big/file.bin", UploadId=uid,
                MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": e2}, {"PartNumber": 2, "ETag": e2}]}), "a wrong part ETag")
    expect_code("InvalidPartOrder", lambda: s3.complete_multipart_upload(Bucket=mb, Key="big/file.bin", UploadId=uid,
                MultipartUpload={"Parts": [{"PartNumber": 2, "ETag": e2}, {"PartNumber": 1, "ETag": e1}]}), "parts out of order")
    su = small_upload(s3, mb)
    expect_code("EntityTooSmall", lambda: s3.complete_multipart_upload(Bucket=mb, Key="small", UploadId=su,
                MultipartUpload={"Parts": small_upload.parts}), "a small first part")
    r = s3.complete_multipart_upload(Bucket=mb, Key="big/file.bin", UploadId=uid,
                                     MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2}]})
    whole = part1 + part2
    got = s3.get_object(Bucket=mb, Key="big/file.bin")
    assert got["Body"].read() == whole and got["ContentType"] == "application/x-big" and got["Metadata"] == {"m": "v"}
    # S3's ETag of parts: the MD5 of the parts' MD5s, and their number.
    of_parts = hashlib.md5(hashlib.md5(part1).digest() + hashlib.md5(part2).digest()).hexdigest()
    assert r["ETag"] == f'"{of_parts}-2"', r["ETag"]
    expect_code("NoSuchUpload", lambda: s3.list_parts(Bucket=mb, Key="big/file.bin", UploadId=uid), "a completed upload")
    # By part number: each part's bytes, the object's ETag and part count; past the last, InvalidPart.
    for n, part in ((1, part1), (2, part2)):
        g = s3.get_object(Bucket=mb, Key="big/file.bin", PartNumber=n)
        assert g["Body"].read() == part and g["PartsCount"] == 2 and g["ETag"] == r["ETag"], (n, g)
        h = s3.head_object(Bucket=mb, Key="big/file.bin", PartNumber=n)
        assert h["ContentLength"] == len(part) and h["PartsCount"] == 2, (n, h)
    expect_code("InvalidPart", lambda: s3.get_object(Bucket=mb, Key="big/file.bin", PartNumber=3), "part 3 of 2")
    a = s3.get_object_attributes(Bucket=mb, Key="big/file.bin", ObjectAttributes=["ETag", "ObjectParts", "ObjectSize", "StorageClass"])
    assert a["ETag"] == r["ETag"].strip('"') and a["ObjectSize"] == len(whole) and a["StorageClass"] == "STANDARD", a
    op = a["ObjectParts"]
    assert op["TotalPartsCount"] == 2 and [(p["PartNumber"], p["Size"]) for p in op["Parts"]] == [(1, len(part1)), (2, len(part2))], op
    page = s3.get_object_attributes(Bucket=mb, Key="big/file.bin", ObjectAttributes=["ObjectParts"], MaxParts=1)["ObjectParts"]
    assert page["IsTruncated"] and page["NextPartNumberMarker"] == 1 and len(page["Parts"]) == 1, page
    # Completed again (a retry after a lost answer): the same answer, as S3 gives.
    again = s3.complete_multipart_upload(Bucket=mb, Key="big/file.bin", UploadId=uid,
                                         MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2}]})
    assert again["ETag"] == r["ETag"], (again, r)
    assert uid not in [u["UploadId"] for u in s3.list_multipart_uploads(Bucket=mb).get("Uploads", [])]
    expect_code("NoSuchUpload", lambda: s3.complete_multipart_upload(Bucket=mb, Key="other-key", UploadId=uid,
                MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": e1}]}), "another key's completed upload")
    # UploadPartCopy: a range of an object as a part.
    up2 = s3.create_multipart_upload(Bucket=mb, Key="copy.bin")["UploadId"]
    pc = s3.upload_part_copy(Bucket=mb, Key="copy.bin", UploadId=up2, PartNumber=1,
                             CopySource={"Bucket": mb, "Key": "big/file.bin"}, CopySourceRange="bytes=0-5242879")
    tail = s3.upload_part(Bucket=mb, Key="copy.bin", UploadId=up2, PartNumber=2, Body=b"tail")["ETag"]
    s3.complete_multipart_upload(Bucket=mb, Key="copy.bin", UploadId=up2, MultipartUpload={"Parts": [
        {"PartNumber": 1, "ETag": pc["CopyPartResult"]["ETag"]}, {"PartNumber": 2, "ETag": tail}]})
    assert s3.get_object(Bucket=mb, Key="copy.bin")["Body"].read() == whole[:5242880] + b"tail"
    up3 = s3.create_multipart_upload(Bucket=mb, Key="aborted.bin")["UploadId"]
    s3.upload_part(Bucket=mb, Key="aborted.bin", UploadId=up3, PartNumber=1, Body=b"x")
    s3.abort_multipart_upload(Bucket=mb, Key="aborted.bin", UploadId=up3)
    expect_code("NoSuchUpload", lambda: s3.upload_part(Bucket=mb, Key="aborted.bin", UploadId=up3, PartNumber=2, Body=b"y"), "an aborted upload")
    expect_code("NoSuchUpload", lambda: s3.abort_multipart_upload(Bucket=mb, Key="x", UploadId="../../etc"), "a hostile upload id")
    uploads = [u["Key"] for u in s3.list_multipart_uploads(Bucket=mb).get("Uploads", [])]
    assert uploads == ["small"], uploads
    # boto3's managed transfer (multipart above its threshold) round-trips.
    from boto3.s3.transfer import TransferConfig
    import io
    data = os.urandom(12 * 1024 * 1024 + 7)
    s3.upload_fileobj(io.BytesIO(data), mb, "managed.bin", Config=TransferConfig(multipart_threshold=5 * 1024 * 1024, multipart_chunksize=5 * 1024 * 1024))
    out = io.BytesIO()
    s3.download_fileobj(mb, "managed.bin", out)
    assert out.getvalue() == data

    # Presigned URLs (SigV4, and boto3's default SigV2 for GET): a GET and a PUT that work, and
    # a GET that has expired.
    v4 = client(endpoint, ak, sk, signature_version="s3v4")
    for signer in (s3, v4):
        url = signer.generate_presigned_url("get_object", Params={"Bucket": b, "Key": "hello.txt"}, ExpiresIn=60)
        assert urllib.request.urlopen(url).read() == body
    url = v4.generate_presigned_url("get_object", Params={"Bucket": b, "Key": "hello.txt"}, ExpiresIn=1)
    time.sleep(2.5)
    try:
        urllib.request.urlopen(url)
        raise AssertionError("an expired presigned URL worked")
    except urllib.error.HTTPError as e:
        text = e.read().decode()
        assert e.code == 403 and "AccessDenied" in text, (e.code, text)
    # S3 lets a presigned URL live 7 days at most; longer is refused, not honoured.
    url = v4.generate_presigned_url("get_object", Params={"Bucket": b, "Key": "hello.txt"}, ExpiresIn=8 * 86400)
    try:
        urllib.request.urlopen(url)
        raise AssertionError("a presigned URL valid for 8 days worked")
    except urllib.error.HTTPError as e:
        text = e.read().decode()
        assert e.code == 400 and "AuthorizationQueryParametersError" in text, (e.code, text)
    # Content-Encoding: aws-chunked is how a body was sent, not what the object is.
    req = signed(endpoint, ak, sk, "PUT", f"/{b}/chunked-enc", b"plain", {"Content-Encoding": "aws-chunked,gzip"})
    status, text = raw(endpoint, req)
    assert status == 200, (status, text)
    assert s3.head_object(Bucket=b, Key="chunked-enc").get("ContentEncoding") == "gzip"
    put_url = v4.generate_presigned_url("put_object", Params={"Bucket": b, "Key": "presigned-put"}, ExpiresIn=60)
    req = urllib.request.Request(put_url, data=b"via url", method="PUT")
    urllib.request.urlopen(req).read()
    assert s3.get_object(Bucket=b, Key="presigned-put")["Body"].read() == b"via url"
    checksums(s3)
    # SigV2 (older clients): bucket requests are signed for `/BUCKET/`, as AWS defines it.
    v2 = client(endpoint, ak, sk, signature_version="s3")
    v2.create_bucket(Bucket="gw-sigv2")
    v2.put_object(Bucket="gw-sigv2", Key="k", Body=b"v2")
    assert [o["Key"] for o in v2.list_objects(Bucket="gw-sigv2")["Contents"]] == ["k"]
    v2.head_bucket(Bucket="gw-sigv2")
    url = v2.generate_presigned_url("list_objects", Params={"Bucket": "gw-sigv2"}, ExpiresIn=60)
    assert urllib.request.urlopen(url).status == 200
    v2.delete_object(Bucket="gw-sigv2", Key="k")
    v2.delete_bucket(Bucket="gw-sigv2")
    print("boto3: every operation checked")


def b64(raw):
    return base64.b64encode(raw).decode()


def crc32_b64(data):
    return b64(zlib.crc32(data).to_bytes(4, "big"))


def checksums(s3):
    """Checksums verified as the bytes arrive, kept with the object, answered when asked."""
    b = "gw-checksums"
    s3.create_bucket(Bucket=b)
    data = os.urandom(300_000)
    sha = b64(hashlib.sha256(data).digest())
    r = s3.put_object(Bucket=b, Key="k", Body=data, ChecksumAlgorithm="SHA256")
    assert r["ChecksumSHA256"] == sha and r.get("ChecksumType") == "FULL_OBJECT", r
    assert "ChecksumSHA256" not in s3.head_object(Bucket=b, Key="k"), "a checksum only when asked"
    h = s3.head_object(Bucket=b, Key="k", ChecksumMode="ENABLED")
    assert h["ChecksumSHA256"] == sha and h["ChecksumType"] == "FULL_OBJECT", h
    # boto3 validates what a GET answers against the bytes it reads.
    assert s3.get_object(Bucket=b, Key="k", ChecksumMode="ENABLED")["Body"].read() == data
    assert "ChecksumSHA256" not in s3.get_object(Bucket=b, Key="k", Range="bytes=0-9", ChecksumMode="ENABLED")
    # A checksum that does not match: BadDigest, and the object is still the one before.
    wrong = b64(zlib.crc32(b"other").to_bytes(4, "big"))
    expect_code("BadDigest", lambda: s3.put_object(Bucket=b, Key="k", Body=b"new bytes", ChecksumCRC32=wrong), "a wrong CRC32")
    expect_code("BadDigest", lambda: s3.put_object(Bucket=b, Key="k", Body=b"new", ChecksumSHA256="bad"), "not a digest")
    assert s3.get_object(Bucket=b, Key="k")["Body"].read() == data, "a refused write stored nothing"
    # boto3's default (a CRC32 of every upload) is kept too.
    s3.put_object(Bucket=b, Key="default", Body=b"defaults")
    h = s3.head_object(Bucket=b, Key="default", ChecksumMode="ENABLED")
    assert h["ChecksumCRC32"] == crc32_b64(b"defaults"), h
    # A copy keeps the checksum of the whole object; one asked for another algorithm is computed.
    c = s3.copy_object(Bucket=b, Key="copy", CopySource={"Bucket": b, "Key": "k"})["CopyObjectResult"]
    assert c["ChecksumSHA256"] == sha, c
    c = s3.copy_object(Bucket=b, Key="copy2", CopySource={"Bucket": b, "Key": "k"}, ChecksumAlgorithm="CRC32")
    assert c["CopyObjectResult"]["ChecksumCRC32"] == crc32_b64(data), c
    assert s3.head_object(Bucket=b, Key="copy2", ChecksumMode="ENABLED")["ChecksumCRC32"] == crc32_b64(data)
    # Multipart, of the whole object (the parts' CRCs combined) and composite (digest of digests).
    p1, p2 = os.urandom(5 * 1024 * 1024), os.urandom(4321)
    for algo, kind in (("CRC32", "FULL_OBJECT"), ("SHA256", "COMPOSITE")):
        key = f"mp-{algo}"
        up = s3.create_multipart_upload(Bucket=b, Key=key, ChecksumAlgorithm=algo, ChecksumType=kind)
        assert up["ChecksumAlgorithm"] == algo and up["ChecksumType"] == kind, up
        uid, field = up["UploadId"], "Checksum" + algo
        parts = []
        for n, body in ((1, p1), (2, p2)):
            r = s3.upload_part(Bucket=b, Key=key, UploadId=uid, PartNumber=n, Body=body, ChecksumAlgorithm=algo)
            parts.append({"PartNumber": n, "ETag": r["ETag"], field: r[field]})
        listed = s3.list_parts(Bucket=b, Key=key, UploadId=uid)
        assert [p[field] for p in listed["Parts"]] == [p[field] for p in parts], listed
        bad = [dict(parts[0], **{field: parts[1][field]}), parts[1]]
        expect_code("InvalidPart", lambda: s3.complete_multipart_upload(Bucket=b, Key=key, UploadId=uid,
                    MultipartUpload={"Parts": bad}), "a part listed with another part's checksum")
        if algo == "CRC32":
            want = crc32_b64(p1 + p2)
        else:
            want = b64(hashlib.sha256(hashlib.sha256(p1).digest() + hashlib.sha256(p2).digest()).digest()) + "-2"
        wrong = crc32_b64(b"x") if algo == "CRC32" else b64(hashlib.sha256(b"x").digest()) + "-2"
        expect_code("BadDigest", lambda: s3.complete_multipart_upload(Bucket=b, Key=key, UploadId=uid,
                    MultipartUpload={"Parts": parts}, **{field: wrong}), "a wrong checksum of the whole")
        r = s3.complete_multipart_upload(Bucket=b, Key=key, UploadId=uid, MultipartUpload={"Parts": parts})
        assert r[field] == want and r["ChecksumType"] == kind, (r, want)
        h = s3.head_object(Bucket=b, Key=key, ChecksumMode="ENABLED")
        assert h[field] == want and h["ChecksumType"] == kind, h
        g = s3.get_object(Bucket=b, Key=key, PartNumber=2, ChecksumMode="ENABLED")
        assert g["Body"].read() == p2 and g[field] == parts[1][field], g
        assert s3.get_object(Bucket=b, Key=key, ChecksumMode="ENABLED")["Body"].read() == p1 + p2
        a = s3.get_object_attributes(Bucket=b, Key=key, ObjectAttributes=["Checksum", "ObjectParts"])
        assert a["Checksum"][field] == want and a["Checksum"]["ChecksumType"] == kind, a
        assert [p[field] for p in a["ObjectParts"]["Parts"]] == [p[field] for p in parts], a
    expect_code("InvalidRequest", lambda: s3.create_multipart_upload(Bucket=b, Key="x", ChecksumAlgorithm="SHA1",
                ChecksumType="FULL_OBJECT"), "a SHA1 of the whole object from parts")


def small_upload(s3, bucket):
    uid = s3.create_multipart_upload(Bucket=bucket, Key="small")["UploadId"]
    e1 = s3.upload_part(Bucket=bucket, Key="small", UploadId=uid, PartNumber=1, Body=b"tiny")["ETag"]
    e2 = s3.upload_part(Bucket=bucket, Key="small", UploadId=uid, PartNumber=2, Body=b"tail")["ETag"]
    small_upload.parts = [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2}]
    return uid


def access_mode(endpoint, admin_ak, admin_sk, reader_ak, reader_sk):
    admin = client(endpoint, admin_ak, admin_sk)
    admin.create_bucket(Bucket="gw-private")
    admin.create_bucket(Bucket="gw-public")
    admin.put_object(Bucket="gw-private", Key="secret.txt", Body=b"for admins")
    admin.put_object(Bucket="gw-public", Key="open.txt", Body=b"for readers")
    reader = client(endpoint, reader_ak, reader_sk)
    assert reader.get_object(Bucket="gw-public", Key="open.txt")["Body"].read() == b"for readers"
    assert [b["Name"] for b in reader.list_buckets()["Buckets"]] == ["gw-public"], "a reader sees only its buckets"
    expect_code("AccessDenied", lambda: reader.put_object(Bucket="gw-public", Key="x", Body=b"x"), "a reader writing")
    expect_code("AccessDenied", lambda: reader.get_object(Bucket="gw-private", Key="secret.txt"), "a reader outside its buckets")
    expect_code("AccessDenied", lambda: reader.create_bucket(Bucket="gw-new"), "a reader creating a bucket")
    expect_code("AccessDenied", lambda: reader.delete_object(Bucket="gw-public", Key="open.txt"), "a reader deleting")
    wrong = client(endpoint, reader_ak, "not-the-secret")
    expect_code("SignatureDoesNotMatch", lambda: wrong.list_buckets(), "a wrong secret")
    unknown = client(endpoint, "AKUNKNOWN", "whatever-secret")
    expect_code("InvalidAccessKeyId", lambda: unknown.list_buckets(), "an unknown key")
    dev = client(endpoint, "tidemark", "tidemark")
    expect_code("InvalidAccessKeyId", lambda: dev.list_buckets(), "the dev key once keys exist")
    # Unsigned: refused, as no anonymous identity is configured.
    try:
        urllib.request.urlopen(f"{endpoint}/gw-public/open.txt")
        raise AssertionError("an unsigned GET worked")
    except urllib.error.HTTPError as e:
        assert e.code == 403, e.code
    # A copy needs Read on its source: the admin may, into a bucket it writes.
    admin.copy_object(Bucket="gw-public", Key="copied.txt", CopySource={"Bucket": "gw-private", "Key": "secret.txt"})
    print("access: every refusal checked")


def unsigned(endpoint, method, path, body=None):
    req = urllib.request.Request(f"{endpoint}{path}", data=body, method=method)
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def owners_mode(endpoint, one_ak, one_sk, two_ak, two_sk):
    """Buckets belong to the identity that created them; ACLs (canned, or grants) open them."""
    one, two = client(endpoint, one_ak, one_sk), client(endpoint, two_ak, two_sk)
    one.create_bucket(Bucket="own-one")
    one.put_object(Bucket="own-one", Key="k", Body=b"one's")
    for what, fn in (("read", lambda: two.get_object(Bucket="own-one", Key="k")),
                     ("list", lambda: two.list_objects_v2(Bucket="own-one")),
                     ("write", lambda: two.put_object(Bucket="own-one", Key="x", Body=b"x")),
                     ("delete", lambda: two.delete_bucket(Bucket="own-one"))):
        expect_code("AccessDenied", fn, f"another identity's bucket: {what}")
    expect_code("BucketAlreadyExists", lambda: two.create_bucket(Bucket="own-one"), "another's bucket name")
    expect_code("BucketAlreadyOwnedByYou", lambda: one.create_bucket(Bucket="own-one"), "one's own again")
    assert "own-one" not in [b["Name"] for b in two.list_buckets()["Buckets"]], "not listed for others"
    assert "own-one" in [b["Name"] for b in one.list_buckets()["Buckets"]]
    acl = one.get_bucket_acl(Bucket="own-one")
    assert acl["Owner"]["ID"] == "one" and [g["Permission"] for g in acl["Grants"]] == ["FULL_CONTROL"], acl
    # Canned ACLs: a public-read object is read by anyone, the others stay private.
    one.put_object(Bucket="own-one", Key="pub", Body=b"public", ACL="public-read")
    assert unsigned(endpoint, "GET", "/own-one/pub") == (200, b"public")
    assert unsigned(endpoint, "GET", "/own-one/k")[0] == 403
    assert unsigned(endpoint, "GET", "/own-one?list-type=2")[0] == 403, "the bucket is not listable yet"
    assert two.get_object(Bucket="own-one", Key="pub")["Body"].read() == b"public"
    grants = one.get_object_acl(Bucket="own-one", Key="pub")["Grants"]
    assert {g["Grantee"].get("URI") for g in grants} == {"http://acs.amazonaws.com/groups/global/AllUsers", None}, grants
    one.put_bucket_acl(Bucket="own-one", ACL="public-read")
    assert unsigned(endpoint, "GET", "/own-one?list-type=2")[0] == 200
    assert unsigned(endpoint, "PUT", "/own-one/anon.txt", b"anon")[0] == 403, "public-read is not public-write"
    one.put_bucket_acl(Bucket="own-one", ACL="public-read-write")
    assert unsigned(endpoint, "PUT", "/own-one/anon.txt", b"anon")[0] == 200
    assert one.get_object(Bucket="own-one", Key="anon.txt")["Body"].read() == b"anon"
    # A copy's ACL is its request's, never its source's.
    one.copy_object(Bucket="own-one", Key="pub-copy", CopySource={"Bucket": "own-one", "Key": "pub"})
    assert unsigned(endpoint, "GET", "/own-one/pub-copy")[0] == 403
    # Grants to an identity: READ on an object lets it read that object and nothing else; a
    # bucket's READ, its listing; WRITE, its objects; READ_ACP / WRITE_ACP, the ACL itself.
    one.create_bucket(Bucket="own-obj")
    one.put_object(Bucket="own-obj", Key="k", Body=b"one's")
    one.put_object(Bucket="own-obj", Key="other", Body=b"one's")
    one.put_object_acl(Bucket="own-obj", Key="k", GrantRead='id="two"')
    assert two.get_object(Bucket="own-obj", Key="k")["Body"].read() == b"one's"
    expect_code("AccessDenied", lambda: two.get_object(Bucket="own-obj", Key="other"), "another object")
    expect_code("AccessDenied", lambda: two.list_objects_v2(Bucket="own-obj"), "an object's grant opens no listing")
    expect_code("AccessDenied", lambda: two.get_object_acl(Bucket="own-obj", Key="k"), "READ is not READ_ACP")
    one.create_bucket(Bucket="own-grant", GrantRead="id=two", GrantReadACP='id="two"')
    got = one.get_bucket_acl(Bucket="own-grant")["Grants"]
    assert sorted((g["Grantee"]["ID"], g["Permission"]) for g in got) == [("two", "READ"), ("two", "READ_ACP")], got
    assert two.list_objects_v2(Bucket="own-grant")["KeyCount"] == 0 and two.get_bucket_acl(Bucket="own-grant")["Grants"]
    expect_code("AccessDenied", lambda: two.put_object(Bucket="own-grant", Key="w", Body=b"w"), "READ is not WRITE")
    assert unsigned(endpoint, "GET", "/own-grant?list-type=2")[0] == 403, "a grant to two is not to everyone"
    owner = one.get_bucket_acl(Bucket="own-grant")["Owner"]
    policy = {"Owner": owner, "Grants": [
        {"Grantee": {"Type": "CanonicalUser", "ID": "one"}, "Permission": "FULL_CONTROL"},
        {"Grantee": {"Type": "CanonicalUser", "ID": "two"}, "Permission": "WRITE"},
        {"Grantee": {"Type": "Group", "URI": "http://acs.amazonaws.com/groups/global/AllUsers"}, "Permission": "READ"}]}
    one.put_bucket_acl(Bucket="own-grant", AccessControlPolicy=policy)
    two.put_object(Bucket="own-grant", Key="w", Body=b"by two")
    assert one.get_object(Bucket="own-grant", Key="w")["Body"].read() == b"by two"
    assert unsigned(endpoint, "GET", "/own-grant?list-type=2")[0] == 200, "AllUsers READ: listed by anyone"
    expect_code("AccessDenied", lambda: two.get_bucket_acl(Bucket="own-grant"), "READ_ACP no longer granted")
    got = one.get_bucket_acl(Bucket="own-grant")["Grants"]
    assert got[0]["Grantee"]["Type"] == "Group" and len(got) == 3, got
    # Grants that cannot be kept: an unknown identity, an e-mail address, both a canned ACL and
    # grants. Nothing is stored.
    bad = dict(policy, Grants=[{"Grantee": {"Type": "CanonicalUser", "ID": "nobody"}, "Permission": "READ"}])
    expect_code("InvalidArgument", lambda: one.put_bucket_acl(Bucket="own-grant", AccessControlPolicy=bad), "an unknown id")
    mail = dict(policy, Grants=[{"Grantee": {"Type": "AmazonCustomerByEmail", "EmailAddress": "two@example.com"}, "Permission": "READ"}])
    expect_code("UnresolvableGrantByEmailAddress", lambda: one.put_bucket_acl(Bucket="own-grant", AccessControlPolicy=mail), "an e-mail grant")
    expect_code("InvalidRequest", lambda: one.put_bucket_acl(Bucket="own-grant", ACL="private", GrantRead="id=two"), "both")
    assert len(one.get_bucket_acl(Bucket="own-grant")["Grants"]) == 3, "unchanged"
    one.delete_object(Bucket="own-grant", Key="w")
    one.delete_bucket(Bucket="own-grant")
    # Object ownership: another identity writes into the public-read-write bucket; who owns what
    # it wrote follows the bucket's ownership control.
    rule = lambda o: {"Rules": [{"ObjectOwnership": o}]}
    expect_code("OwnershipControlsNotFoundError", lambda: one.get_bucket_ownership_controls(Bucket="own-one"), "no controls")
    owner_of = lambda k: one.get_object_acl(Bucket="own-one", Key=k)["Owner"]["ID"]
    two.put_object(Bucket="own-one", Key="by-two", Body=b"2")
    assert owner_of("by-two") == "one", "no controls: the bucket owner's"
    one.put_bucket_ownership_controls(Bucket="own-one", OwnershipControls=rule("ObjectWriter"))
    two.put_object(Bucket="own-one", Key="by-two", Body=b"2")
    assert owner_of("by-two") == "two", "ObjectWriter: its writer's"
    mpu = two.create_multipart_upload(Bucket="own-one", Key="mpu-two")
    assert one.list_parts(Bucket="own-one", Key="mpu-two", UploadId=mpu["UploadId"])["Owner"]["ID"] == "two"
    two.abort_multipart_upload(Bucket="own-one", Key="mpu-two", UploadId=mpu["UploadId"])
    one.put_bucket_ownership_controls(Bucket="own-one", OwnershipControls=rule("BucketOwnerPreferred"))
    two.put_object(Bucket="own-one", Key="by-two", Body=b"2", ACL="bucket-owner-full-control")
    assert owner_of("by-two") == "one", "BucketOwnerPreferred, given full control: the bucket owner's"
    expect_code("InvalidBucketAclWithObjectOwnership",
                lambda: one.put_bucket_ownership_controls(Bucket="own-one", OwnershipControls=rule("BucketOwnerEnforced")),
                "ACLs off over a public ACL")
    one.put_bucket_acl(Bucket="own-one", ACL="private")
    one.put_bucket_ownership_controls(Bucket="own-one", OwnershipControls=rule("BucketOwnerEnforced"))
    assert one.get_bucket_ownership_controls(Bucket="own-one")["OwnershipControls"]["Rules"] == [{"ObjectOwnership": "BucketOwnerEnforced"}]
    expect_code("AccessControlListNotSupported",
                lambda: one.put_object(Bucket="own-one", Key="acl", Body=b"x", ACL="public-read"), "an ACL with ACLs off")
    expect_code("AccessControlListNotSupported", lambda: one.put_bucket_acl(Bucket="own-one", ACL="private"), "a bucket ACL with ACLs off")
    one.put_object(Bucket="own-one", Key="acl", Body=b"x", ACL="bucket-owner-full-control")
    one.delete_bucket_ownership_controls(Bucket="own-one")
    expect_code("OwnershipControlsNotFoundError", lambda: one.get_bucket_ownership_controls(Bucket="own-one"), "deleted")
    print("owners: each identity's buckets are its own")


def policy_mode(endpoint, one_ak, one_sk, two_ak, two_sk):
    """Bucket policies: Allow opens, Deny wins (the owner included), what is not evaluated is refused."""
    one, two = client(endpoint, one_ak, one_sk), client(endpoint, two_ak, two_sk)
    b = "pol-one"
    one.create_bucket(Bucket=b)
    for k in ("public/a", "private/b", "docs/c"):
        one.put_object(Bucket=b, Key=k, Body=k.encode())
    expect_code("NoSuchBucketPolicy", lambda: one.get_bucket_policy(Bucket=b), "no policy yet")
    policy = {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": "*", "Action": "s3:GetObject", "Resource": f"arn:aws:s3:::{b}/public/*"},
        {"Effect": "Allow", "Principal": {"AWS": ["arn:aws:iam:::user/two"]}, "Action": "s3:ListBucket",
         "Resource": f"arn:aws:s3:::{b}", "Condition": {"StringLike": {"s3:prefix": "docs/*"}}},
        {"Effect": "Deny", "Principal": "*", "Action": "s3:DeleteObject", "Resource": f"arn:aws:s3:::{b}/*",
         "Condition": {"Bool": {"aws:SecureTransport": "false"}}}]}
    import json
    one.put_bucket_policy(Bucket=b, Policy=json.dumps(policy))
    assert json.loads(one.get_bucket_policy(Bucket=b)["Policy"]) == policy
    assert one.get_bucket_policy_status(Bucket=b)["PolicyStatus"]["IsPublic"] is True
    assert unsigned(endpoint, "GET", f"/{b}/public/a") == (200, b"public/a")
    assert unsigned(endpoint, "GET", f"/{b}/private/b")[0] == 403
    keys = [o["Key"] for o in two.list_objects_v2(Bucket=b, Prefix="docs/")["Contents"]]
    assert keys == ["docs/c"], keys
    expect_code("AccessDenied", lambda: two.list_objects_v2(Bucket=b), "a listing the condition does not allow")
    expect_code("AccessDenied", lambda: two.get_object(Bucket=b, Key="private/b"), "not allowed to two")
    expect_code("AccessDenied", lambda: one.delete_object(Bucket=b, Key="private/b"), "a Deny wins over the owner")
    # A Deny on the source address (the client is on loopback): even the owner reads nothing, and
    # may still mend the policy.
    deny_local = {"Statement": [{"Effect": "Deny", "Principal": "*", "Action": "s3:GetObject", "Resource": f"arn:aws:s3:::{b}/*",
                                 "Condition": {"IpAddress": {"aws:SourceIp": "127.0.0.0/8"}}}]}
    one.put_bucket_policy(Bucket=b, Policy=json.dumps(deny_local))
    expect_code("AccessDenied", lambda: one.get_object(Bucket=b, Key="docs/c"), "a source-address Deny")
    one.delete_bucket_policy(Bucket=b)
    assert one.get_object(Bucket=b, Key="docs/c")["Body"].read() == b"docs/c"
    # Conditions on tags: an object's own (a Deny on secret=yes, even for the owner; an Allow on
    # Team=two for two) and those a put gives it.
    tagged = {"Statement": [
        {"Effect": "Deny", "Principal": "*", "Action": "s3:GetObject", "Resource": f"arn:aws:s3:::{b}/*",
         "Condition": {"StringEquals": {"s3:ExistingObjectTag/secret": "yes"}}},
        {"Effect": "Allow", "Principal": {"AWS": "two"}, "Action": "s3:GetObject", "Resource": f"arn:aws:s3:::{b}/*",
         "Condition": {"StringEquals": {"s3:ExistingObjectTag/Team": "two"}}},
        {"Effect": "Allow", "Principal": {"AWS": "two"}, "Action": "s3:PutObject", "Resource": f"arn:aws:s3:::{b}/*",
         "Condition": {"StringEquals": {"s3:RequestObjectTag/Team": "two"}}}]}
    one.put_bucket_policy(Bucket=b, Policy=json.dumps(tagged))
    one.put_object_tagging(Bucket=b, Key="docs/c", Tagging={"TagSet": [{"Key": "secret", "Value": "yes"}]})
    expect_code("AccessDenied", lambda: one.get_object(Bucket=b, Key="docs/c"), "a Deny on an object's tag")
    one.put_object_tagging(Bucket=b, Key="private/b", Tagging={"TagSet": [{"Key": "Team", "Value": "two"}]})
    assert two.get_object(Bucket=b, Key="private/b")["Body"].read() == b"private/b", "an Allow on an object's tag"
    one.put_object_tagging(Bucket=b, Key="private/b", Tagging={"TagSet": [{"Key": "team", "Value": "two"}]})
    expect_code("AccessDenied", lambda: two.get_object(Bucket=b, Key="private/b"), "a tag's key is case-sensitive")
    two.put_object(Bucket=b, Key="by-two", Body=b"2", Tagging="Team=two")
    expect_code("AccessDenied", lambda: two.put_object(Bucket=b, Key="by-two", Body=b"2", Tagging="Team=one"), "another tag")
    expect_code("AccessDenied", lambda: two.put_object(Bucket=b, Key="by-two", Body=b"2"), "no tag")
    one.delete_bucket_policy(Bucket=b)
    one.delete_object_tagging(Bucket=b, Key="docs/c")
    # Refused, and nothing stored.
    expect_code("MalformedPolicy", lambda: one.put_bucket_policy(Bucket=b, Policy="{"), "not JSON")
    untagged = {"Statement": [{"Effect": "Deny", "Principal": "*", "Action": "s3:GetObject", "Resource": f"arn:aws:s3:::{b}/*",
                               "Condition": {"StringEquals": {"s3:ExistingObjectTags/secret": "yes"}}}]}
    expect_code("NotImplemented", lambda: one.put_bucket_policy(Bucket=b, Policy=json.dumps(untagged)), "a key not evaluated")
    other = {"Statement": [{"Effect": "Allow", "Principal": "*", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::other/*"}]}
    expect_code("MalformedPolicy", lambda: one.put_bucket_policy(Bucket=b, Policy=json.dumps(other)), "another bucket's resource")
    expect_code("NoSuchBucketPolicy", lambda: one.get_bucket_policy(Bucket=b), "nothing stored")
    # A public access block shuts what ACLs and policies opened, and refuses to open more.
    p = "pab-one"
    one.create_bucket(Bucket=p)
    expect_code("NoSuchPublicAccessBlockConfiguration", lambda: one.get_public_access_block(Bucket=p), "none yet")
    one.put_object(Bucket=p, Key="acl", Body=b"acl", ACL="public-read")
    one.put_object(Bucket=p, Key="pol", Body=b"pol")
    public = json.dumps({"Statement": [{"Effect": "Allow", "Principal": "*", "Action": "s3:GetObject",
                                        "Resource": f"arn:aws:s3:::{p}/pol"}]})
    one.put_bucket_policy(Bucket=p, Policy=public)
    assert unsigned(endpoint, "GET", f"/{p}/acl")[0] == 200 and unsigned(endpoint, "GET", f"/{p}/pol")[0] == 200
    block = {"BlockPublicAcls": True, "IgnorePublicAcls": True, "BlockPublicPolicy": True, "RestrictPublicBuckets": True}
    one.put_public_access_block(Bucket=p, PublicAccessBlockConfiguration=block)
    assert one.get_public_access_block(Bucket=p)["PublicAccessBlockConfiguration"] == block
    assert unsigned(endpoint, "GET", f"/{p}/acl")[0] == 403, "a public ACL ignored"
    assert unsigned(endpoint, "GET", f"/{p}/pol")[0] == 403, "a public policy restricted"
    expect_code("AccessDenied", lambda: one.put_object(Bucket=p, Key="x", Body=b"x", ACL="public-read"), "a public ACL blocked")
    expect_code("AccessDenied", lambda: one.put_bucket_policy(Bucket=p, Policy=public), "a public policy blocked")
    assert one.get_object(Bucket=p, Key="pol")["Body"].read() == b"pol", "the owner still reads"
    one.delete_public_access_block(Bucket=p)
    assert unsigned(endpoint, "GET", f"/{p}/acl")[0] == 200 and unsigned(endpoint, "GET", f"/{p}/pol")[0] == 200
    print("policies: allowed, denied and refused as written")


def anonymous_mode(endpoint):
    assert urllib.request.urlopen(f"{endpoint}/gw-public/open.txt").read() == b"for readers"
    try:
        urllib.request.urlopen(f"{endpoint}/gw-private/secret.txt")
        raise AssertionError("anonymous read outside its bucket")
    except urllib.error.HTTPError as e:
        assert e.code == 403, e.code
    # A missing object: 404 where the bucket lets anyone list, 403 where it does not; a missing
    # bucket: 404.
    for path, code in [("gw-public/absent.txt", 404), ("gw-private/absent.txt", 403), ("no-such-bucket-here/x", 404)]:
        try:
            urllib.request.urlopen(f"{endpoint}/{path}")
            raise AssertionError(f"anonymous read of {path}")
        except urllib.error.HTTPError as e:
            assert e.code == code, (path, e.code)
    print("anonymous: reads what it was granted, nothing else")


def signed(endpoint, ak, sk, method, path, body, headers=None):
    url = endpoint + path
    headers = dict(headers or {})
    headers["host"] = urllib.parse.urlparse(endpoint).netloc
    req = AWSRequest(method=method, url=url, data=body, headers=headers)
    req.headers["x-amz-content-sha256"] = hashlib.sha256(body).hexdigest()
    SigV4Auth(Credentials(ak, sk), "s3", "us-east-1").add_auth(req)
    return req


def raw_response(endpoint, req):
    u = urllib.parse.urlparse(endpoint)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    conn.request(req.method, urllib.parse.urlparse(req.url).path, body=req.body, headers=dict(req.headers))
    return conn.getresponse()


def raw(endpoint, req, body_override=None, close_early=False):
    u = urllib.parse.urlparse(endpoint)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    path = urllib.parse.urlparse(req.url).path
    q = urllib.parse.urlparse(req.url).query
    conn.putrequest(req.method, path + (f"?{q}" if q else ""), skip_accept_encoding=True, skip_host=True)
    payload = body_override if body_override is not None else (req.body or b"")
    for k, v in req.headers.items():
        conn.putheader(k, v)
    if "Content-Length" not in req.headers:
        conn.putheader("Content-Length", str(len(req.body or b"")))
    conn.endheaders()
    conn.send(payload)
    if close_early:
        conn.sock.shutdown(1)
    resp = conn.getresponse()
    return resp.status, resp.read().decode(errors="replace")


def trailer_checksums(endpoint, ak, sk, s3, b):
    """What current SDKs send over HTTPS: an unsigned aws-chunked body whose CRC32 comes in a
    trailer, after the bytes. A damaged body is refused and stores nothing."""
    data = os.urandom(100_000)

    def put(key, value, announced="x-amz-checksum-crc32", sent="x-amz-checksum-crc32"):
        chunked = b"%x\r\n" % len(data) + data + b"\r\n0\r\n"
        if sent:
            chunked += f"{sent}:{value}\r\n".encode()
        chunked += b"\r\n"
        headers = {"content-encoding": "aws-chunked", "x-amz-decoded-content-length": str(len(data)),
                   "x-amz-trailer": announced, "content-length": str(len(chunked))}
        req = AWSRequest(method="PUT", url=f"{endpoint}/{b}/{key}", data=chunked,
                         headers=dict(headers, host=urllib.parse.urlparse(endpoint).netloc))
        req.headers["x-amz-content-sha256"] = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
        SigV4Auth(Credentials(ak, sk), "s3", "us-east-1").add_auth(req)
        return raw(endpoint, req)

    status, text = put("trailer-ok", crc32_b64(data))
    assert status == 200, (status, text)
    h = s3.head_object(Bucket=b, Key="trailer-ok", ChecksumMode="ENABLED")
    assert h["ChecksumCRC32"] == crc32_b64(data) and h["ContentLength"] == len(data), h
    assert s3.get_object(Bucket=b, Key="trailer-ok")["Body"].read() == data
    status, text = put("trailer-bad", crc32_b64(data[1:]))
    assert status == 400 and "BadDigest" in text, (status, text)
    status, text = put("trailer-missing", None, sent=None)
    assert status == 400, (status, text)
    for key in ("trailer-bad", "trailer-missing"):
        expect_code("404", lambda: s3.head_object(Bucket=b, Key=key), f"{key}: nothing stored")


def errors_mode(endpoint, ak, sk):
    s3 = client(endpoint, ak, sk)
    b = "gw-errors"
    s3.create_bucket(Bucket=b)
    s3.put_object(Bucket=b, Key="keep.txt", Body=b"original")
    # A refusal that may come before the body was read closes the connection: the client cannot
    # know where the next request would start (found as "xPUT" requests under load).
    req = signed(endpoint, ak, sk, "PUT", f"/{b}/" + "x" * 300, b"body")
    resp = raw_response(endpoint, req)
    assert resp.status == 400 and resp.getheader("Connection", "").lower() == "close", (resp.status, resp.getheaders())
    # Malformed XML in DeleteObjects.
    bad_xml = b"<Delete><Object><Key>keep.txt</Key></Obj"
    req = signed(endpoint, ak, sk, "POST", f"/{b}?delete", bad_xml,
                 {"Content-MD5": base64.b64encode(hashlib.md5(bad_xml).digest()).decode()})
    status, text = raw(endpoint, req)
    assert status == 400 and "MalformedXML" in text, (status, text)
    # Every answer names its request, and an error document carries the same id, as S3's do.
    m = re.search(r"<RequestId>([0-9A-F]{16})</RequestId>", text)
    assert m, text
    try:
        s3.get_object(Bucket=b, Key="no-such-key")
        raise AssertionError("a missing key was found")
    except ClientError as e:
        rid = e.response["ResponseMetadata"].get("RequestId", "")
        assert re.fullmatch(r"[0-9A-F]{16}", rid), e.response
        assert e.response["ResponseMetadata"]["HTTPHeaders"].get("x-amz-request-id") == rid, e.response
    ok_rid = s3.head_object(Bucket=b, Key="keep.txt")["ResponseMetadata"].get("RequestId", "")
    assert re.fullmatch(r"[0-9A-F]{16}", ok_rid), ok_rid
    # A body shorter than its Content-Length: the client gives up; nothing is written.
    body = b"x" * 1000
    req = signed(endpoint, ak, sk, "PUT", f"/{b}/keep.txt", body)
    req.headers["Content-Length"] = str(len(body))
    try:
        status, text = raw(endpoint, req, body_override=body[:400], close_early=True)
        assert status >= 400, (status, text)
    except (ConnectionError, http.client.HTTPException):
        pass
    time.sleep(0.5)
    assert s3.get_object(Bucket=b, Key="keep.txt")["Body"].read() == b"original", "a short body changed nothing"
    # Clock skew: a request signed an hour in the past (botocore's clock, set back while it signs).
    import datetime as dt
    real = botocore.auth.datetime.datetime

    class AnHourAgo(real):
        @classmethod
        def utcnow(cls):
            return real.utcnow() - dt.timedelta(hours=1)

        @classmethod
        def now(cls, tz=None):
            return real.now(tz) - dt.timedelta(hours=1)

    botocore.auth.datetime.datetime = AnHourAgo
    try:
        req = signed(endpoint, ak, sk, "GET", f"/{b}/keep.txt", b"")
    finally:
        botocore.auth.datetime.datetime = real
    status, text = raw(endpoint, req)
    assert status == 403 and ("RequestTimeTooSkewed" in text or "AccessDenied" in text), (status, text)
    # SigV2 header signatures carry their time in Date (or x-amz-date): one signed properly but
    # an hour ago, in an hour, or with no date at all is a replay, refused like SigV4's.
    import email.utils
    import hmac

    def v2(date_header, when):
        path = f"/{b}/keep.txt"
        date = email.utils.formatdate(when, usegmt=True) if when is not None else "not a date"
        amz = date_header == "x-amz-date"
        to_sign = f"GET\n\n\n{'' if amz else date}\n" + (f"x-amz-date:{date}\n" if amz else "") + path
        sig = base64.b64encode(hmac.new(sk.encode(), to_sign.encode(), hashlib.sha1).digest()).decode()
        req = AWSRequest(method="GET", url=endpoint + path, data=b"",
                         headers={"host": urllib.parse.urlparse(endpoint).netloc, date_header: date,
                                  "Authorization": f"AWS {ak}:{sig}"})
        return raw(endpoint, req)

    for header in ("Date", "x-amz-date"):
        status, text = v2(header, time.time())
        assert status == 200 and text == "original", ("a fresh SigV2 request works", header, status, text)
        for skew in (-3600, 3600):
            status, text = v2(header, time.time() + skew)
            assert status == 403 and "RequestTimeTooSkewed" in text, ("SigV2 replay", header, skew, status, text)
        status, text = v2(header, None)
        assert status == 403 and "AccessDenied" in text and "date" in text.lower(), ("SigV2 without a date", header, status, text)
    # Oversize headers: refused, and the gateway still serves.
    req = signed(endpoint, ak, sk, "GET", f"/{b}/keep.txt", b"", {"x-amz-meta-huge": "y" * 200_000})
    try:
        status, text = raw(endpoint, req)
        assert status >= 400, status
    except (ConnectionError, http.client.HTTPException):
        pass
    expect_code("MetadataTooLarge", lambda: s3.put_object(Bucket=b, Key="meta", Body=b"x", Metadata={"big": "z" * 3000}), "too much metadata")
    # A CompleteMultipartUpload document of 62 MiB is refused as too long (a 4xx, not a 500), and
    # the upload can still be completed.
    up = s3.create_multipart_upload(Bucket=b, Key="huge-doc")["UploadId"]
    etag = s3.upload_part(Bucket=b, Key="huge-doc", UploadId=up, PartNumber=1, Body=b"p")["ETag"]
    huge = [{"PartNumber": i, "ETag": '"' + "a" * 6200 + '"'} for i in range(1, 10001)]
    expect_code("MaxMessageLengthExceeded", lambda: s3.complete_multipart_upload(Bucket=b, Key="huge-doc", UploadId=up, MultipartUpload={"Parts": huge}), "a 62 MiB document")
    s3.complete_multipart_upload(Bucket=b, Key="huge-doc", UploadId=up, MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]})
    assert s3.get_object(Bucket=b, Key="huge-doc")["Body"].read() == b"p"
    # Listing details: an empty delimiter is none, FetchOwner brings owners, ListBuckets pages.
    r = s3.list_objects_v2(Bucket=b, Delimiter="")
    assert "Delimiter" not in r and all("Owner" not in o for o in r["Contents"]), r
    r = s3.list_objects_v2(Bucket=b, FetchOwner=True)
    assert all(o["Owner"]["ID"] for o in r["Contents"]), r
    for n in ("page-a1", "page-a2", "page-a3"):
        s3.create_bucket(Bucket=n)
    seen, token = [], None
    while True:
        kw = {"MaxBuckets": 2, "Prefix": "page-a"} | ({"ContinuationToken": token} if token else {})
        r = s3.list_buckets(**kw)
        seen += [x["Name"] for x in r["Buckets"]]
        token = r.get("ContinuationToken")
        if not token:
            break
    assert seen == ["page-a1", "page-a2", "page-a3"], seen
    # Versions as an unversioned bucket has them: each object once, version "null", which deletes.
    s3.put_object(Bucket=b, Key="v/one", Body=b"1")
    r = s3.list_object_versions(Bucket=b, Prefix="v/")
    assert [(v["Key"], v["VersionId"], v["IsLatest"]) for v in r["Versions"]] == [("v/one", "null", True)], r
    s3.delete_objects(Bucket=b, Delete={"Objects": [{"Key": "v/one", "VersionId": "null"}]})
    assert "Versions" not in s3.list_object_versions(Bucket=b, Prefix="v/") or not s3.list_object_versions(Bucket=b, Prefix="v/")["Versions"]
    # Conditional deletes: only while the ETag is the one asked for.
    s3.put_object(Bucket=b, Key="cond.txt", Body=b"v1")
    etag = s3.head_object(Bucket=b, Key="cond.txt")["ETag"]
    expect_code("PreconditionFailed", lambda: s3.delete_object(Bucket=b, Key="cond.txt", IfMatch='"0123"'), "delete if-match, other etag")
    assert s3.get_object(Bucket=b, Key="cond.txt")["Body"].read() == b"v1", "kept"
    expect_code("NoSuchKey", lambda: s3.delete_object(Bucket=b, Key="absent.txt", IfMatch=etag), "delete if-match, no such key")
    r = s3.delete_objects(Bucket=b, Delete={"Objects": [{"Key": "cond.txt", "ETag": '"0123"'}]})
    assert [e["Code"] for e in r.get("Errors", [])] == ["PreconditionFailed"], r
    s3.delete_object(Bucket=b, Key="cond.txt", IfMatch=etag)
    expect_code("404", lambda: s3.head_object(Bucket=b, Key="cond.txt"), "deleted when the etag matched")
    # If-None-Match with an ETag: refused over the object that has it, done over any other.
    s3.put_object(Bucket=b, Key="inm.txt", Body=b"one")
    etag = s3.head_object(Bucket=b, Key="inm.txt")["ETag"]
    expect_code("PreconditionFailed", lambda: s3.put_object(Bucket=b, Key="inm.txt", Body=b"two", IfNoneMatch=etag), "put if-none-match, its etag")
    s3.put_object(Bucket=b, Key="inm.txt", Body=b"three", IfNoneMatch='"0123"')
    assert s3.get_object(Bucket=b, Key="inm.txt")["Body"].read() == b"three"
    # S3 Express's delete conditions: the size and the last-modified time.
    h = s3.head_object(Bucket=b, Key="inm.txt")
    expect_code("PreconditionFailed", lambda: s3.delete_object(Bucket=b, Key="inm.txt", IfMatchSize=h["ContentLength"] + 1), "delete if-match-size")
    expect_code("PreconditionFailed", lambda: s3.delete_object(Bucket=b, Key="inm.txt", IfMatchLastModifiedTime="2015-01-01T00:00:00Z"), "delete if-match-last-modified-time")
    s3.delete_object(Bucket=b, Key="inm.txt", IfMatchSize=h["ContentLength"], IfMatchLastModifiedTime=h["LastModified"])
    expect_code("404", lambda: s3.head_object(Bucket=b, Key="inm.txt"), "deleted when size and time matched")
    # A browser form (POST) is stored as its policy allows; one its conditions refuse is 403,
    # as S3 answers, and stores nothing.
    import requests
    post = s3.generate_presigned_post(Bucket=b, Key="form.txt", Conditions=[["starts-with", "$key", "form"]])
    r = requests.post(post["url"], data=post["fields"], files={"file": ("f", b"by form")})
    assert r.status_code == 204, (r.status_code, r.text)
    assert s3.get_object(Bucket=b, Key="form.txt")["Body"].read() == b"by form"
    r = requests.post(post["url"], data=post["fields"] | {"key": "other.txt"}, files={"file": ("f", b"x")})
    assert r.status_code == 403 and "<Code>AccessDenied</Code>" in r.text, (r.status_code, r.text)
    expect_code("404", lambda: s3.head_object(Bucket=b, Key="other.txt"), "a refused form stores nothing")
    # A copy's range must lie within its source (a GET's is cut to the object instead).
    s3.put_object(Bucket=b, Key="five.txt", Body=b"12345")
    mpu = s3.create_multipart_upload(Bucket=b, Key="ranged")
    expect_code("InvalidRange", lambda: s3.upload_part_copy(Bucket=b, Key="ranged", UploadId=mpu["UploadId"], PartNumber=1,
                CopySource={"Bucket": b, "Key": "five.txt"}, CopySourceRange="bytes=0-21"), "a copy range past the source")
    s3.abort_multipart_upload(Bucket=b, Key="ranged", UploadId=mpu["UploadId"])
    # Expires is kept; x-amz-expected-bucket-owner is checked; the policy status answers.
    import datetime
    exp = datetime.datetime(2031, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)
    s3.put_object(Bucket=b, Key="exp.txt", Body=b"x", Expires=exp)
    assert s3.head_object(Bucket=b, Key="exp.txt")["Expires"] == exp
    owner = s3.get_bucket_acl(Bucket=b)["Owner"]["ID"]
    s3.list_objects_v2(Bucket=b, ExpectedBucketOwner=owner)
    expect_code("AccessDenied", lambda: s3.list_objects_v2(Bucket=b, ExpectedBucketOwner=owner + "x"), "expected bucket owner")
    assert s3.get_bucket_policy_status(Bucket=b)["PolicyStatus"]["IsPublic"] is False
    # Object lock is not done, nor is SSE-S3 or SSE-KMS without a keyring (this server has
    # none), so never accepted as if they were: refused, and nothing stored.
    key = b"k" * 32
    for what, extra in [
        ("SSE-S3", {"ServerSideEncryption": "AES256"}),
        ("SSE-KMS", {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": "alias/x"}),
        ("object lock", {"ObjectLockMode": "GOVERNANCE", "ObjectLockRetainUntilDate": "2030-01-01T00:00:00Z"}),
        ("legal hold", {"ObjectLockLegalHoldStatus": "ON"}),
    ]:
        expect_code("NotImplemented", lambda: s3.put_object(Bucket=b, Key="enc", Body=b"x", **extra), what)
        expect_code("NotImplemented", lambda: s3.create_multipart_upload(Bucket=b, Key="enc", **extra), what + " (multipart)")
        expect_code("NotImplemented", lambda: s3.copy_object(Bucket=b, Key="enc", CopySource=f"{b}/keep.txt", **extra), what + " (copy)")
    expect_code("404", lambda: s3.head_object(Bucket=b, Key="enc"), "nothing stored")
    expect_code("InvalidRequest", lambda: s3.get_object(Bucket=b, Key="keep.txt", SSECustomerAlgorithm="AES256", SSECustomerKey=key), "SSE-C read")
    # A declared body larger than S3 allows in one request is refused before it is read (the
    # client sends only the head: nothing is spooled).
    u = urllib.parse.urlparse(endpoint)
    req = AWSRequest(method="PUT", url=f"{endpoint}/{b}/huge", data=b"",
                     headers={"host": u.netloc, "x-amz-content-sha256": "UNSIGNED-PAYLOAD", "Content-Length": str(6 * 10**12)})
    SigV4Auth(Credentials(ak, sk), "s3", "us-east-1").add_auth(req)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    conn.putrequest("PUT", f"/{b}/huge", skip_accept_encoding=True, skip_host=True)
    for k, v in req.headers.items():
        conn.putheader(k, v)
    conn.endheaders()
    resp = conn.getresponse()
    text = resp.read().decode()
    assert resp.status == 400 and "EntityTooLarge" in text, (resp.status, text)
    # Bucket names S3 refuses.
    for bad in ("foo-.bar", "foo.-bar", "192.168.5.4", "xn--abc"):
        expect_code("InvalidBucketName", lambda: s3.create_bucket(Bucket=bad), bad)
    # An unsupported operation says so.
    expect_code("NotImplemented",
                lambda: s3.put_bucket_accelerate_configuration(Bucket=b, AccelerateConfiguration={"Status": "Enabled"}),
                "an unsupported operation")
    expect_code("MalformedPolicy", lambda: s3.put_bucket_policy(Bucket=b, Policy="{}"), "a policy with no statement")
    assert s3.get_object(Bucket=b, Key="keep.txt")["Body"].read() == b"original"
    trailer_checksums(endpoint, ak, sk, s3, b)
    print("errors: every bad input refused")


def run(cmd, env, **kw):
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, **kw)
    assert r.returncode == 0, f"{cmd}: exit {r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr}"
    return r.stdout


def rclone(env, endpoint, ak, sk, work):
    """rclone's environment for the gateway as remote `tm` (as its users configure it), and its command."""
    renv = {k: v for k, v in env.items() if not k.startswith("AWS_")}
    renv.update(RCLONE_CONFIG_TM_TYPE="s3", RCLONE_CONFIG_TM_PROVIDER="Other",
                RCLONE_CONFIG_TM_ACCESS_KEY_ID=ak, RCLONE_CONFIG_TM_SECRET_ACCESS_KEY=sk,
                RCLONE_CONFIG_TM_ENDPOINT=endpoint, RCLONE_CONFIG_TM_REGION="us-east-1",
                RCLONE_CONFIG_TM_FORCE_PATH_STYLE="true", RCLONE_CONFIG=os.path.join(work, "rclone.conf"))
    rc = ["rclone", "--retries", "1", "--low-level-retries", "1", "--s3-upload-cutoff", "5M", "--s3-chunk-size", "5M"]
    return renv, rc


def tools_mode(endpoint, ak, sk, work):
    env = dict(os.environ, AWS_ACCESS_KEY_ID=ak, AWS_SECRET_ACCESS_KEY=sk, AWS_DEFAULT_REGION="us-east-1",
               AWS_EC2_METADATA_DISABLED="true")
    aws = ["aws", "--endpoint-url", endpoint]
    src = os.path.join(work, "src")
    os.makedirs(os.path.join(src, "sub", "deeper"), exist_ok=True)
    files = {"a.txt": b"alpha\n", "sub/b c.txt": b"bravo\n", "sub/deeper/c+d.bin": os.urandom(9 * 1024 * 1024),
             "unicodé.txt": "ünï".encode()}
    for rel, data in files.items():
        with open(os.path.join(src, rel), "wb") as f:
            f.write(data)
    run(aws + ["s3", "mb", "s3://gw-tools"], env)
    run(aws + ["s3", "cp", os.path.join(src, "a.txt"), "s3://gw-tools/single/a.txt"], env)
    out = run(aws + ["s3", "ls", "s3://gw-tools/single/"], env)
    assert "a.txt" in out, out
    run(aws + ["s3", "sync", src, "s3://gw-tools/synced"], env)
    listed = run(aws + ["s3", "ls", "--recursive", "s3://gw-tools/synced/"], env)
    for rel in files:
        assert f"synced/{rel}" in listed, (rel, listed)
    dst = os.path.join(work, "dst")
    run(aws + ["s3", "sync", "s3://gw-tools/synced", dst], env)
    for rel, data in files.items():
        with open(os.path.join(dst, rel), "rb") as f:
            assert f.read() == data, rel
    again = run(aws + ["s3", "sync", src, "s3://gw-tools/synced"], env)
    assert again.strip() == "", f"a second sync uploads nothing: {again}"
    head = run(aws + ["s3api", "head-object", "--bucket", "gw-tools", "--key", "synced/a.txt"], env)
    assert hashlib.md5(b"alpha\n").hexdigest() in head, head
    run(aws + ["s3", "rm", "--recursive", "s3://gw-tools/single"], env)
    out = run(aws + ["s3", "ls", "s3://gw-tools/"], env)
    assert "single/" not in out and "synced/" in out, out

    # rclone, configured from the environment as its users do.
    renv, rc = rclone(env, endpoint, ak, sk, work)
    run(rc + ["mkdir", "tm:gw-rclone"], renv)
    run(rc + ["copy", src, "tm:gw-rclone/copy"], renv)
    run(rc + ["check", src, "tm:gw-rclone/copy"], renv)
    lsf = set(run(rc + ["lsf", "-R", "--files-only", "tm:gw-rclone/copy"], renv).splitlines())
    assert lsf == set(files), lsf
    os.remove(os.path.join(src, "a.txt"))
    with open(os.path.join(src, "new.txt"), "wb") as f:
        f.write(b"new file\n")
    run(rc + ["sync", src, "tm:gw-rclone/copy"], renv)
    run(rc + ["check", src, "tm:gw-rclone/copy"], renv)
    names = run(rc + ["lsf", "tm:gw-rclone/copy"], renv).splitlines()
    assert "a.txt" not in names and "new.txt" in names, names
    back = os.path.join(work, "back")
    run(rc + ["copy", "tm:gw-rclone/copy", back], renv)
    run(rc + ["check", src, back], renv)
    print("tools: aws s3 and rclone round-trips checked")


def stored_anywhere(data_dir, marker):
    """Whether `marker` is in any file under data_dir: the content store, the metadata, all."""
    for root, _, names in os.walk(data_dir):
        for n in names:
            try:
                with open(os.path.join(root, n), "rb") as f:
                    if marker in f.read():
                        return True
            except OSError:
                pass
    return False


def sse_mode(endpoint, ak, sk, work, data_dir, kms_key, bare_endpoint):
    s3 = client(endpoint, ak, sk)
    b = "gw-sse"
    s3.create_bucket(Bucket=b)
    key_a = os.urandom(32)
    key_b = os.urandom(32)
    def c_args(k, prefix="SSECustomer"):
        return {f"{prefix}Algorithm": "AES256", f"{prefix}Key": k,}
    body = b"TIDEMARK-SSE-MARKER-" + os.urandom(64).hex().encode()
    plain_marker = b"TIDEMARK-PLAIN-MARKER-" + os.urandom(16).hex().encode()

    # Unencrypted, for contrast: its bytes are found on disk as written.
    s3.put_object(Bucket=b, Key="plain", Body=plain_marker)

    # SSE-S3: answered as such; the ETag is the plaintext's MD5, as S3's.
    r = s3.put_object(Bucket=b, Key="s3", Body=body, ServerSideEncryption="AES256")
    assert r["ServerSideEncryption"] == "AES256", r
    assert r["ETag"].strip('"') == hashlib.md5(body).hexdigest(), r["ETag"]
    g = s3.get_object(Bucket=b, Key="s3")
    assert g["Body"].read() == body and g["ServerSideEncryption"] == "AES256"
    assert s3.get_object(Bucket=b, Key="s3", Range="bytes=5-24")["Body"].read() == body[5:25]
    assert s3.head_object(Bucket=b, Key="s3")["ServerSideEncryption"] == "AES256"
    listed = s3.list_objects_v2(Bucket=b, Prefix="s3")["Contents"][0]
    assert listed["Size"] == len(body), listed

    # SSE-KMS with a keyring key; a key the keyring lacks is refused.
    r = s3.put_object(Bucket=b, Key="kms", Body=body, ServerSideEncryption="aws:kms", SSEKMSKeyId=kms_key)
    assert r["ServerSideEncryption"] == "aws:kms" and r["SSEKMSKeyId"] == kms_key, r
    g = s3.get_object(Bucket=b, Key="kms")
    assert g["Body"].read() == body and g["SSEKMSKeyId"] == kms_key
    expect_code("KMS.NotFoundException",
                lambda: s3.put_object(Bucket=b, Key="x", Body=b"x", ServerSideEncryption="aws:kms", SSEKMSKeyId="nope"),
                "a KMS key the keyring lacks")

    # SSE-C: readable with its key only.
    r = s3.put_object(Bucket=b, Key="c", Body=body, **c_args(key_a))
    assert r["SSECustomerAlgorithm"] == "AES256", r
    expect_code("InvalidRequest", lambda: s3.get_object(Bucket=b, Key="c"), "an SSE-C object read without its key")
    assert code_of(lambda: s3.get_object(Bucket=b, Key="c", **c_args(key_b))) is not None, "a wrong key"
    assert s3.get_object(Bucket=b, Key="c", **c_args(key_a))["Body"].read() == body
    assert s3.get_object(Bucket=b, Key="c", Range="bytes=70-", **c_args(key_a))["Body"].read() == body[70:]
    expect_code("InvalidRequest", lambda: s3.get_object(Bucket=b, Key="s3", **c_args(key_a)),
                "a customer key for an object without one")

    # A multipart upload under a customer key: every part needs it; ranges across parts decrypt.
    big = os.urandom(5 * 1024 * 1024) + body
    u = s3.create_multipart_upload(Bucket=b, Key="mp", **c_args(key_a))["UploadId"]
    assert code_of(lambda: s3.upload_part(Bucket=b, Key="mp", UploadId=u, PartNumber=1, Body=big[:5 << 20])) \
        == "InvalidRequest", "a part without the upload's key"
    e1 = s3.upload_part(Bucket=b, Key="mp", UploadId=u, PartNumber=1, Body=big[:5 << 20], **c_args(key_a))["ETag"]
    again = s3.upload_part(Bucket=b, Key="mp", UploadId=u, PartNumber=1, Body=big[:5 << 20], **c_args(key_a))["ETag"]
    assert e1 == again, "a part sent twice has one ETag"
    e2 = s3.upload_part(Bucket=b, Key="mp", UploadId=u, PartNumber=2, Body=big[5 << 20:], **c_args(key_a))["ETag"]
    s3.complete_multipart_upload(Bucket=b, Key="mp", UploadId=u, **c_args(key_a),
                                 MultipartUpload={"Parts": [{"ETag": e1, "PartNumber": 1}, {"ETag": e2, "PartNumber": 2}]})
    lo, hi = (5 << 20) - 10, (5 << 20) + 30
    got = s3.get_object(Bucket=b, Key="mp", Range=f"bytes={lo}-{hi}", **c_args(key_a))["Body"].read()
    assert got == big[lo:hi + 1]
    assert s3.get_object(Bucket=b, Key="mp", PartNumber=2, **c_args(key_a))["Body"].read() == body
    assert s3.get_object(Bucket=b, Key="mp", **c_args(key_a))["Body"].read() == big

    # A copy decrypts its source with the source's key and encrypts as asked.
    s3.copy_object(Bucket=b, Key="c-to-s3", CopySource={"Bucket": b, "Key": "c"}, ServerSideEncryption="AES256",
                   **c_args(key_a, "CopySourceSSECustomer"))
    g = s3.get_object(Bucket=b, Key="c-to-s3")
    assert g["Body"].read() == body and g["ServerSideEncryption"] == "AES256"
    expect_code("InvalidRequest", lambda: s3.copy_object(Bucket=b, Key="y", CopySource={"Bucket": b, "Key": "c"}),
                "a copy of an SSE-C object without its key")

    # A bucket's default encryption applies to writes that ask for none.
    s3.put_bucket_encryption(Bucket=b, ServerSideEncryptionConfiguration={
        "Rules": [{"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]})
    assert s3.put_object(Bucket=b, Key="default", Body=body)["ServerSideEncryption"] == "AES256"
    rules = s3.get_bucket_encryption(Bucket=b)["ServerSideEncryptionConfiguration"]["Rules"]
    assert rules[0]["ApplyServerSideEncryptionByDefault"]["SSEAlgorithm"] == "AES256", rules
    s3.delete_bucket_encryption(Bucket=b)
    expect_code("ServerSideEncryptionConfigurationNotFoundError", lambda: s3.get_bucket_encryption(Bucket=b),
                "a bucket without default encryption")
    assert "ServerSideEncryption" not in s3.put_object(Bucket=b, Key="after", Body=b"x")

    # At rest: the encrypted objects' bytes are nowhere on disk; the unencrypted one's are.
    assert stored_anywhere(data_dir, plain_marker), "the scan finds what is stored as written"
    assert not stored_anywhere(data_dir, body[:40]), "an encrypted object's plaintext is on disk"

    # The AWS CLI and rclone, each with SSE-S3 and SSE-C, round-trip a file.
    env = dict(os.environ, AWS_ACCESS_KEY_ID=ak, AWS_SECRET_ACCESS_KEY=sk, AWS_DEFAULT_REGION="us-east-1",
               AWS_EC2_METADATA_DISABLED="true")
    aws = ["aws", "--endpoint-url", endpoint]
    src = os.path.join(work, "sse-src")
    os.makedirs(src, exist_ok=True)
    with open(os.path.join(src, "f.bin"), "wb") as f:
        f.write(os.urandom(6 * 1024 * 1024))
    cli_key = "0123456789abcdef0123456789abcdef"
    run(aws + ["s3", "cp", os.path.join(src, "f.bin"), f"s3://{b}/cli/s3.bin", "--sse", "AES256"], env)
    run(aws + ["s3", "cp", os.path.join(src, "f.bin"), f"s3://{b}/cli/c.bin", "--sse-c", "AES256", "--sse-c-key", cli_key], env)
    run(aws + ["s3", "cp", f"s3://{b}/cli/c.bin", os.path.join(work, "c.back"), "--sse-c", "AES256", "--sse-c-key", cli_key], env)
    run(aws + ["s3", "cp", f"s3://{b}/cli/s3.bin", os.path.join(work, "s3.back")], env)
    for back in ("c.back", "s3.back"):
        with open(os.path.join(work, back), "rb") as f1, open(os.path.join(src, "f.bin"), "rb") as f2:
            assert f1.read() == f2.read(), back
    base, rc = rclone(env, endpoint, ak, sk, work)
    # (rclone sends a customer key over HTTPS only: SSE-C is the AWS CLI's above.)
    for name, extra in [("s3", dict(RCLONE_CONFIG_TM_SERVER_SIDE_ENCRYPTION="AES256"))]:
        renv = dict(base, **extra)
        # rclone checks each upload's MD5 against the ETag where it is one (SSE-S3).
        run(rc + ["copy", src, f"tm:{b}/rclone-{name}"], renv)
        back = os.path.join(work, f"rclone-{name}")
        run(rc + ["copy", f"tm:{b}/rclone-{name}", back], renv)
        with open(os.path.join(back, "f.bin"), "rb") as f1, open(os.path.join(src, "f.bin"), "rb") as f2:
            assert f1.read() == f2.read(), name

    # Without a keyring, SSE-S3 and SSE-KMS are refused, never stored unencrypted; SSE-C works.
    bare = client(bare_endpoint, ak, sk)
    bare.create_bucket(Bucket="gw-bare")
    expect_code("NotImplemented", lambda: bare.put_object(Bucket="gw-bare", Key="k", Body=b"x", ServerSideEncryption="AES256"),
                "SSE-S3 without a keyring")
    expect_code("404", lambda: bare.head_object(Bucket="gw-bare", Key="k"), "nothing stored")
    bare.put_object(Bucket="gw-bare", Key="c", Body=b"x", **c_args(key_a))
    assert bare.get_object(Bucket="gw-bare", Key="c", **c_args(key_a))["Body"].read() == b"x"
    print("sse: SSE-S3, SSE-KMS and SSE-C checked with boto3, the AWS CLI and rclone")


if __name__ == "__main__":
    mode, rest = sys.argv[1], sys.argv[2:]
    {"boto3": boto3_mode, "access": access_mode, "owners": owners_mode, "policies": policy_mode, "anonymous": anonymous_mode, "errors": errors_mode,
     "tools": tools_mode, "sse": sse_mode}[mode](*rest)
