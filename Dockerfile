# The collector as a container, built from this checkout (hopline is not on a package index):
#   docker build -t hopline-collector .
#   docker run -p 9400:9400 -v hopline-events:/var/lib/hopline hopline-collector
# `hopline dashboards build` writes a docker-compose.yml whose collector builds from here.
FROM python:3.11-slim
WORKDIR /src
COPY . /src
# EXTRAS: the extras to install; the generated stack builds `hopline watch` with EXTRAS=analyzer
ARG EXTRAS=collector
RUN pip install --no-cache-dir "/src[${EXTRAS}]"
EXPOSE 9400
ENTRYPOINT ["hopline", "collector"]
CMD ["--host", "0.0.0.0", "--port", "9400", "--data-dir", "/var/lib/hopline"]
