# cmake -DIN=<etcd .proto> -DOUT=<copy> -P strip_proto.cmake
# etcd's .proto files (Debian's golang-etcd-server-dev) carry gogoproto and
# google.api.http options that only its Go and HTTP-gateway generators read.
# The copy keeps every message and service as they are and drops those
# imports and options, so that protoc with the C++ and gRPC plugins alone
# compiles them; the wire format does not change.
file(READ ${IN} text)
string(REGEX REPLACE "import \"gogoproto/gogo.proto\";" "" text "${text}")
string(REGEX REPLACE "import \"google/api/annotations.proto\";" "" text "${text}")
string(REGEX REPLACE "option \\(gogoproto\\.[a-z_]+\\) = [a-z]+;" "" text "${text}")
string(REGEX REPLACE "option \\(google\\.api\\.http\\) = {([^{}]|{[^{}]*})*};" "" text "${text}")
string(REGEX REPLACE " *\\[\\(gogoproto\\.[^]]*\\]" "" text "${text}")
if(text MATCHES "gogoproto|google\\.api")
  message(FATAL_ERROR "${IN}: options left that protoc cannot read without gogoproto or google.api")
endif()
file(WRITE ${OUT} "${text}")
