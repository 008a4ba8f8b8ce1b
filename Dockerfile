# syntax=docker/dockerfile:1

# The pipeline worker. Build: `docker compose build worker`; run through docker-compose.yml.

# Shared base: Node 24, the tested LTS line supported longest (see docs/deploy.md), plus the toolchain
# better-sqlite3 falls back to when no prebuilt binary fits. The runtime stage uses the same image.
FROM node:24-bookworm-slim AS base
RUN apt-get update \
  && apt-get install -y --no-install-recommends python3 make g++ \
  && rm -rf /var/lib/apt/lists/*
WORKDIR /app

# Compile TypeScript (tsc -p tsconfig.json) into dist/; needs the devDependencies.
FROM base AS build
COPY package.json package-lock.json ./
RUN npm ci
COPY . .
RUN npm run build

# Production dependencies only (no tsx, typescript, eslint...); native modules are built here, with the toolchain.
FROM base AS prod-deps
COPY package.json package-lock.json ./
RUN npm ci --omit=dev && npm cache clean --force

# Runtime: no compiler, no devDependencies, no sources; code owned by root and read-only to the `node` user.
FROM node:24-bookworm-slim AS runtime
ENV NODE_ENV=production \
  DATA_DIR=/app/data
WORKDIR /app
COPY package.json package-lock.json ./
COPY --from=prod-deps /app/node_modules ./node_modules
COPY --from=build /app/dist ./dist
RUN mkdir -p /app/data && chown node:node /app/data
USER node
CMD ["node", "dist/src/cli/worker.js"]
